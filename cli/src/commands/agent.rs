//! `isthmus agent`: logging, capabilities, then the daemon.

use std::time::Duration;

use anyhow::{Result, bail};

use crate::cli::{AgentArgs, LogFormat};
use isthmus_agent::daemon::{DaemonConfig, DaemonError, HealthRole, KubeRole, SlurmRole};
use isthmus_agent::discovery::HostConfig;
use isthmus_agent::slurm::SlurmMode;
use isthmus_agent::slurm::munge::MungeConfig;
use isthmus_agent::slurm::node::{SlurmConfig, SlurmConfigError};

/// Structured logs to stderr (`RUST_LOG` filters; default `info`).
pub(crate) fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Run `agent` until SIGTERM.
pub(crate) fn run(args: &AgentArgs) -> Result<()> {
    init_logging(args.log_format);
    // A long-running daemon: only the code it runs stays resident.
    isthmus_agent::own_code::map_on_use();
    // Still the only thread: capabilities are per thread, and every later thread and child inherits these.
    isthmus_agent::privileges::apply(
        args.slurm_mode,
        args.slurm_cgroups,
        args.slurm_conf.as_deref(),
    );
    let plan = isthmus_agent::daemon::Plan::new(daemon_config(args)?)?;
    let code = isthmus_agent::daemon::run(plan)?;
    if code != 0 {
        bail!("agent stopped with code {code}");
    }
    Ok(())
}

/// The daemon's settings from the command line: the one place that reads the agent's arguments.
pub(crate) fn daemon_config(args: &AgentArgs) -> Result<DaemonConfig, DaemonError> {
    let node_name = args.slurm.node_name();
    let slurm = match args.slurm_mode {
        SlurmMode::Off => None,
        mode => Some(SlurmRole {
            node: SlurmConfig {
                mode,
                node: node_name.clone().map_err(SlurmConfigError::from)?,
                slurmd: args.slurmd.clone(),
                slurm_conf: args.slurm_conf.clone(),
                conf_server: args.conf_server.clone(),
                slurmd_args: args.slurmd_args.clone(),
                gres_out: args.gres_out.clone(),
                options: args.slurm.node_options(),
                topology: args.slurm_topology.clone(),
                failed_gpus: args.slurm_failed_gpus,
            },
            munge: (!args.no_munged).then(|| MungeConfig {
                munged: args.munged.clone(),
                socket: args.munge_socket.clone(),
                key: args.munge_key.clone(),
                state_dir: args.munge_state_dir.clone(),
            }),
            grace: Duration::from_secs(args.grace_seconds),
            slurmd_readyz: args.slurmd_readyz,
            confinement: isthmus_agent::slurm::jobs_confined::observe(
                args.slurm_cgroups,
                args.slurm_conf
                    .as_deref()
                    .filter(|_| args.conf_server.is_none()),
            ),
            allow_unconfined: args.slurm_allow_unconfined,
        }),
    };
    Ok(DaemonConfig {
        host: HostConfig::from(&args.host),
        listen: args.listen.clone(),
        rediscover: Duration::from_secs(args.rediscover_seconds.max(1)),
        neighbours: args.neighbours,
        node_name,
        slurm,
        kube: KubeRole {
            publish_nrt: args.publish_nrt,
            report_conditions: args.report_conditions,
            numatopology: args.publish_numatopology,
            numatopology_recheck: Duration::from_secs(args.numatopology_recheck_seconds),
            takeover: args.nrt_takeover,
            mig_strategy: args.mig_strategy,
            kubelet: isthmus_agent::k8s::kubelet_view::Source {
                root: isthmus_topology::HostRoot::new(&args.host.host_root),
                config: args.kubelet_config.clone(),
                socket: args.pod_resources_socket.clone(),
                interval: Duration::from_secs_f64(args.pod_resources_interval.clamp(0.1, 3600.0)),
                first_answer_wait: Duration::from_secs_f64(
                    args.kubelet_wait_seconds.clamp(0.0, 3600.0),
                ),
                pod_cgroups: args.pod_cgroups.clone(),
            },
        },
        device_plugin: args.device_plugin.role(&args.pod_resources_socket),
        health: HealthRole {
            xid_override: args.health.xid_override.clone(),
            xid_replay: args.health.xid_replay.clone(),
            heartbeat: Duration::from_secs(args.health.health_heartbeat_seconds),
            flap: isthmus_topology::health::ports::FlapPolicy {
                threshold: args.health.ib_flap_threshold,
                window: Duration::from_secs(args.health.ib_flap_window_seconds),
                quiet: Duration::from_secs(args.health.ib_flap_quiet_seconds),
            },
        },
    })
}
