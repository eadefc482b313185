//! `isthmus controller ...`: `render` (offline) and `run` (the controller: one runtime, logs, `/metrics`,
//! `/healthz`, `/readyz`, SIGTERM/SIGINT → clean stop, leader election and the leader tasks from
//! `isthmus_controller::run`, and in every replica the admission webhook from `isthmus_controller::webhook`).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::cli::{ControllerCommand, ControllerRunArgs};
use isthmus_agent::http::{Endpoint, Health};
use isthmus_agent::metrics::Metrics;

/// How often the main loop proves it is alive for `/healthz`.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// How often readiness follows the webhook's certificate.
const READINESS_CHECK: Duration = Duration::from_millis(500);

/// Run a controller subcommand.
pub(crate) fn run(command: ControllerCommand) -> Result<()> {
    match command {
        ControllerCommand::Render(args) => {
            let (text, warnings) = isthmus_controller::offline::render_with_warnings(&args)?;
            for w in &warnings {
                eprintln!("isthmus: warning: {w}");
            }
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .context("writing to stdout")?;
            out.flush().context("writing to stdout")?;
            Ok(())
        }
        ControllerCommand::Run(args) => run_controller(*args),
    }
}

/// `isthmus controller run` until SIGTERM/SIGINT.
fn run_controller(args: ControllerRunArgs) -> Result<()> {
    crate::commands::agent::init_logging(args.log_format);
    let metrics = Arc::new(Metrics::install_global().map_err(anyhow::Error::msg)?);
    let listener = isthmus_agent::http::bind(&args.listen)
        .with_context(|| format!("binding {}", args.listen))?;
    let webhook = match &args.run.webhook.listen {
        Some(addr) => Some(
            isthmus_agent::http::bind(addr)
                .with_context(|| format!("binding the webhook's {addr}"))?,
        ),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let result = rt.block_on(serve(args.run, listener, webhook, metrics));
    rt.shutdown_timeout(Duration::from_millis(500));
    result
}

async fn serve(
    args: isthmus_controller::run::RunArgs,
    listener: std::net::TcpListener,
    webhook_listener: Option<std::net::TcpListener>,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let shutdown = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let health = Arc::new(Health::default());
    health.beat();
    let endpoint = Endpoint {
        metrics,
        health: health.clone(),
        stale_after: HEARTBEAT * 6,
    };
    tracing::info!(address = ?listener.local_addr().ok(), "serving /metrics, /healthz, /readyz");
    let http = tokio::spawn(isthmus_agent::http::serve(
        listener,
        endpoint,
        shutdown.clone(),
    ));

    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client (in-cluster or KUBECONFIG)")?;
    // Every replica serves the admission webhook, the leader or not.
    let webhook = webhook_listener
        .map(|l| {
            tracing::info!(address = ?l.local_addr().ok(), "serving the admission webhook");
            isthmus_controller::webhook::start(
                client.clone(),
                &args.webhook,
                &args.namespace,
                l,
                shutdown.clone(),
            )
        })
        .transpose()
        .context("starting the admission webhook")?;
    let controller = tokio::spawn(isthmus_controller::run::run(client, args, shutdown.clone()));
    // Ready once the client exists (a standby replica is ready too: it takes over without a restart) and the
    // webhook, when served, has its certificate.
    let ready = || webhook.as_ref().is_none_or(|w| w.ready());
    health.set_ready(ready());
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let mut readiness = tokio::time::interval(READINESS_CHECK);
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = heartbeat.tick() => health.beat(),
            _ = readiness.tick() => health.set_ready(ready()),
        }
    }
    tracing::info!("stopping");
    health.set_ready(false);
    shutdown.cancel();
    if tokio::time::timeout(Duration::from_secs(15), controller)
        .await
        .is_err()
    {
        tracing::warn!("the controller did not stop within 15 s");
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), http).await;
    Ok(())
}
