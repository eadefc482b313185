//! Replicas of the controller running placement under leader election, in-process: each campaigns for a real
//! Lease (its own name per test, in the controller's namespace, under the controller's Role), as the shipped
//! ServiceAccount, through its own API server address (the server's, or a [`crate::proxy::Proxy`]'s) and its own
//! logging wrappers of the Slurm tools ([`Tools`]), so that a test can tell what each replica did.

use std::sync::Arc;

use clap::Parser;
use isthmus_controller::leader::fence::Fence;
use isthmus_controller::placement::CancellationToken;
use isthmus_controller::run::{self, LeaderContext, RunArgs};
use isthmus_controller::slurm::SlurmClient;

use crate::apiserver::client_for;
use crate::placement::{CONTROLLER_NS, Placement};
use crate::slurm_tools::Tools;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

/// The election's durations, seconds: lease, renew deadline, retry period.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `--lease-seconds`.
    pub lease: u64,
    /// `--lease-renew-deadline-seconds`.
    pub renew_deadline: u64,
    /// `--lease-retry-seconds`.
    pub retry: u64,
}

/// One replica; stopped when dropped.
#[allow(missing_debug_implementations)]
pub struct Replica {
    /// Its identity in the Lease.
    pub identity: String,
    /// Its fence: whether it leads.
    pub fence: Fence,
    /// Its Slurm tools.
    pub tools: Tools,
    token: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Replica {
    /// Stop it (its leader tasks end, the Lease is released when it can be).
    pub fn stop(&mut self, p: &Placement) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            let _ = p.rt.block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(20), task).await
            });
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl Placement {
    /// Start a replica `identity` that reaches the API server at `server` (`None`: directly) and runs only the
    /// placement task while it leads the Lease `lease-<namespace>`; Slurm and API calls time out after 2 s.
    pub fn start_replica(&self, identity: &str, server: Option<&str>, timing: Timing) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = match server {
            None => self.sa_kubeconfig().to_path_buf(),
            Some(url) => {
                let text = std::fs::read_to_string(self.sa_kubeconfig()).unwrap();
                let path = dir.path().join("kubeconfig");
                std::fs::write(&path, text.replace(self.api_url(), url)).unwrap();
                path
            }
        };
        let tools = Tools::for_release(
            self.release(),
            &["squeue", "sbatch", "scancel", "scontrol", "sdiag"],
        );
        let a = self.args();
        let conf = self.slurm_conf().display().to_string();
        let bin = tools.path().display().to_string();
        let (lease, deadline, retry) = (
            timing.lease.to_string(),
            timing.renew_deadline.to_string(),
            timing.retry.to_string(),
        );
        let argv = [
            "isthmus",
            "--namespace",
            CONTROLLER_NS,
            "--identity",
            identity,
            "--lease-name",
            &format!("lease-{}", self.ns),
            "--lease-seconds",
            &lease,
            "--lease-renew-deadline-seconds",
            &deadline,
            "--lease-retry-seconds",
            &retry,
            "--api-timeout",
            "2s",
            "--slurm-conf",
            &conf,
            "--slurm-bin-dir",
            &bin,
            "--slurm-timeout",
            "2s",
            "--placement",
            "--placement-scheduler-name",
            &a.scheduler_name,
            "--placement-policy",
            &a.policy,
            "--placement-owners",
            &a.owners,
        ];
        // The submit method only where the test gives one: otherwise the replica detects it, as a site's does.
        let how = a
            .submit_as
            .and_then(|h| clap::ValueEnum::to_possible_value(&h))
            .map(|v| format!("--placement-submit-as={}", v.get_name()));
        let args = Cli::try_parse_from(argv.iter().copied().chain(how.as_deref()))
            .unwrap()
            .run;
        let timing = args.lease_timing();
        let fence = Fence::new(timing.duration, timing.renew_deadline);
        let client = self.rt.block_on(client_for(&kubeconfig));
        let ctx = LeaderContext {
            watches: isthmus_controller::run::Watches::new(&client),
            client,
            slurm: SlurmClient::new(args.slurm.clone()),
            args: Arc::new(args),
            fence: fence.clone(),
        };
        let tasks = run::leader_tasks()
            .into_iter()
            .filter(|t| t.name == "placement")
            .collect();
        let token = CancellationToken::new();
        let task = self.rt.spawn(run::campaign(ctx, tasks, token.clone()));
        Replica {
            identity: identity.to_owned(),
            fence,
            tools,
            token,
            task: Some(task),
            _dir: dir,
        }
    }
}
