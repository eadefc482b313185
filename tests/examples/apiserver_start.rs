//! How long the test API server takes: `ApiServer::start()` (etcd + kube-apiserver until `/readyz` and the
//! `default` namespace answer) and `restart()` (kube-apiserver only), RUNS times each (default 5), one at a time.
//!
//! ```sh
//! cargo run -p isthmus-tests --example apiserver_start      # RUNS=5
//! ```

use std::time::{Duration, Instant};

use isthmus_tests::apiserver::{ApiServer, assets};

fn summary(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let ms = |d: &Duration| d.as_millis();
    let (min, max) = (times.first(), times.last());
    let median = times.get(times.len() / 2);
    if let (Some(min), Some(median), Some(max)) = (min, median, max) {
        println!(
            "{what}: median {} ms, min {} ms, max {} ms ({} runs)",
            ms(median),
            ms(min),
            ms(max),
            times.len()
        );
    }
}

fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    println!("assets: {}", assets().display());
    let (mut starts, mut restarts) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let mut server = ApiServer::start();
        starts.push(t.elapsed());
        let t = Instant::now();
        server.restart();
        restarts.push(t.elapsed());
    }
    summary("start (etcd + kube-apiserver)", starts);
    summary("restart (kube-apiserver)", restarts);
}
