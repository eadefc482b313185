//! `isthmus agent --slurmd-readyz` with a real slurmd of Slurm 26.05 (which serves `GET /readyz` on its
//! `SlurmdPort`): the agent's own /readyz follows slurmd's. The site authenticates with `auth/slurm` (no munged) and
//! the node is dynamic (`slurmd -Z`), as in a current production profile.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use isthmus_tests::slurm::{children_of, wait_until};
use isthmus_tests::slurmctld::{Auth, Controller};
use isthmus_tests::{each_release, fixtures, free_port, http_get, isthmus_bin};

/// The agent as a child process: SIGTERM (it stops slurmd), then SIGKILL, when dropped.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = isthmus_tests::slurm::term(self.child.id());
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) && matches!(self.child.try_wait(), Ok(None))
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the agent for the dynamic node `node` of `ctl`'s site, its slurmd the release's, listening on `listen`.
fn start_agent(ctl: &Controller, node: &str, listen: &str, extra: &[&str]) -> Agent {
    let release = ctl.release();
    let d = ctl.path();
    let log = d.join("agent.log");
    let file = std::fs::File::create(&log).unwrap();
    // A release in a root runs each program through `enter`, which needs capabilities the agent would take from
    // its children when it narrows their bounding set; without CAP_SETPCAP it cannot narrow it (slurm_agent/).
    let mut cmd = if release.root_dir().is_some() {
        let mut c = Command::new("setpriv");
        c.arg("--bounding-set=-setpcap").arg(isthmus_bin());
        c
    } else {
        Command::new(isthmus_bin())
    };
    let child = cmd
        .arg("agent")
        .arg("--host-root")
        .arg(fixtures().join("hosts/xe9680-8xh100/root"))
        .args(["--node-name", node, "--no-nvml", "--grace-seconds", "5"])
        .args(["--rediscover-seconds", "1", "--listen", listen])
        .arg("--slurm-conf")
        .arg(ctl.conf())
        .arg("--slurmd")
        .arg(release.program("slurmd"))
        .arg("--no-munged")
        .arg("--dev-dir")
        .arg(d.join("dev"))
        .args(["--slurm-mode", "dynamic", "--real-memory-mib", "1000"])
        .args(["--node-addr", "127.0.0.1"])
        .args(extra)
        .env_remove("HWLOC_FSROOT")
        .env_remove("HWLOC_COMPONENTS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    Agent { child, log }
}

each_release! {
only [V26_05]
/// With `--slurmd-readyz` the agent's /readyz follows slurmd's: ready once slurmd services RPCs; not ready while
/// slurmd runs but does not answer (stopped with SIGSTOP: still a live child to the supervisor, which alone would
/// keep the agent ready); ready again after SIGCONT.
fn the_agent_is_ready_while_slurmds_readyz_succeeds(release) {
    let ctl = Controller::start_on(
        release,
        Auth::Slurm,
        "MaxNodeCount=16\nTreeWidth=65533\nReturnToService=2\nSlurmdTimeout=30\nGresTypes=gpu",
        "",
        &[],
    );
    let conf = std::fs::read_to_string(ctl.conf()).unwrap();
    let port = conf
        .lines()
        .find_map(|l| l.strip_prefix("SlurmdPort="))
        .unwrap_or_else(|| panic!("{conf}"))
        .to_owned();
    let listen = format!("127.0.0.1:{}", free_port());
    let agent = start_agent(&ctl, "rz1", &listen, &["--slurmd-readyz", &format!("127.0.0.1:{port}")]);
    wait_until("rz1 to be IDLE", Duration::from_secs(90), || {
        let out = ctl.run("scontrol", &["show", "node", "rz1"]);
        String::from_utf8_lossy(&out.stdout).contains("State=IDLE")
    });
    let agent_ready = |want: u16| {
        wait_until(&format!("the agent's /readyz {want}"), Duration::from_secs(30), || {
            http_get(&listen, "/readyz").is_ok_and(|(code, _)| code == want)
        });
    };
    agent_ready(200);
    let slurmd = children_of(agent.child.id())
        .into_iter()
        .find(|(_, comm, state)| comm == "slurmd" && *state != 'Z')
        .map(|(pid, _, _)| pid)
        .unwrap_or_else(|| panic!("no slurmd\n{}", agent.log()));
    let signal = |sig: &str| assert!(isthmus_tests::slurm::kill_with(slurmd, sig), "kill -{sig}");
    signal("STOP");
    agent_ready(503);
    // slurmd was neither restarted nor replaced: the agent saw it run and not answer.
    let running: Vec<u32> = children_of(agent.child.id())
        .into_iter()
        .filter(|(_, comm, state)| comm == "slurmd" && *state != 'Z')
        .map(|(pid, _, _)| pid)
        .collect();
    assert_eq!(running, vec![slurmd]);
    assert!(agent.log().contains("slurmd's /readyz: not ready"), "{}", agent.log());
    signal("CONT");
    agent_ready(200);
    assert!(agent.log().contains("slurmd's /readyz: ready"), "{}", agent.log());
}
}
