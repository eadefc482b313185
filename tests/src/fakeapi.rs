//! A loopback stand-in for the Kubernetes API server (no API server can run here): it answers the two calls the
//! agent makes — `GET /api/v1/nodes/<name>` and server-side apply `PATCH .../noderesourcetopologies/<name>` — records
//! every request, and can be told to fail.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When it arrived.
    pub at: Instant,
    /// Method.
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Content-Type.
    pub content_type: String,
    /// Body.
    pub body: String,
    /// The status it was answered with.
    pub status: u16,
}

/// The fake server's shared state.
#[derive(Debug, Default)]
pub struct State {
    /// Requests seen.
    pub seen: Vec<Seen>,
    /// Answer every request with this status instead (e.g. 500, 403) while set.
    pub fail_with: Option<u16>,
}

/// Start the server on 127.0.0.1; returns its address and state.
pub fn start(node_uid: &str) -> (String, Arc<Mutex<State>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let state = Arc::new(Mutex::new(State::default()));
    let shared = state.clone();
    let uid = node_uid.to_owned();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let shared = shared.clone();
            let uid = uid.clone();
            std::thread::spawn(move || {
                let _ = serve(stream, &shared, &uid);
            });
        }
    });
    (addr, state)
}

fn serve(stream: TcpStream, state: &Mutex<State>, uid: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("").to_owned();
        let mut length = 0usize;
        let mut content_type = String::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    "content-type" => content_type = v.trim().to_owned(),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let body = String::from_utf8_lossy(&body).into_owned();
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        let fail = s.fail_with;
        let (status, reply) = match (fail, method.as_str()) {
            (Some(code), _) => (code, format!(r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected","code":{code}}}"#)),
            (None, "GET") if target.starts_with("/api/v1/nodes/") => {
                let name = target.trim_start_matches("/api/v1/nodes/");
                (200, format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{name}","uid":"{uid}"}}}}"#))
            }
            (None, "PATCH") => (200, body.clone()),
            (None, _) => (404, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound"}"#.to_owned()),
        };
        s.seen.push(Seen {
            at: Instant::now(),
            method,
            target,
            content_type,
            body,
            status,
        });
        drop(s);
        write!(
            out,
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        )?;
        out.flush()?;
    }
}

/// A kubeconfig file pointing at the fake server (plain HTTP, no credentials).
pub fn kubeconfig(dir: &std::path::Path, addr: &str) -> std::path::PathBuf {
    let p = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    );
    std::fs::write(&p, text).unwrap();
    p
}
