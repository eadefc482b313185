//! The node sync's actions under faults: cordon → drain, uncordon → resume, health failure → drain + taint,
//! recovery → resume, device clash → eviction. One Node (`fc1`) is acted on; another (`fc2`) stays drained by the
//! administrator throughout, and every case checks it still is: nothing the node sync did not drain is lifted.

use std::time::{Duration, Instant, SystemTime};

use isthmus_controller::nodesync::NodeSyncArgs;

use super::{Fault, Outcome, arm, await_fired, converge};
use crate::nodesync::SyncSite;
use crate::slurm_release::SlurmRelease;

/// The Node the cases act on.
pub const NODE: &str = "fc1";
/// The Node the administrator drained.
pub const ADMIN_DRAINED: &str = "fc2";
const ADMIN_REASON: &str = "maintenance by the administrator";
const CORDON_REASON: &str = "isthmus: cordoned in Kubernetes";
const HEALTH_REASON: &str = "isthmus: health: gpu 0000:9b:00.0";
const GPU_FAILED: &str = "failed: 0000:9b:00.0. XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on GPU 4 \
     (0000:9b:00.0): reboot (XID table v1)";
const CLASH_POD: &str = "on-the-jobs-gpu";

/// The node sync's flags in these cases (a short hold: recovery is acted on 1 s after the report).
pub fn args() -> NodeSyncArgs {
    NodeSyncArgs {
        node_sync: true,
        condition_hold: Duration::from_secs(1),
        ..NodeSyncArgs::default()
    }
}

/// Where the cases leave the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Drained by the node sync for the cordon, recorded as its own, untainted, the condition `False`.
    Cordoned,
    /// Drained for health, recorded, the health taint on, the condition `False`.
    HealthDrained,
    /// Not drained, nothing recorded, no isthmus taint, the condition `True`.
    Resumed,
    /// The clashing pod evicted, once.
    Evicted,
}

/// What a case does before, at and after its fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Nothing,
    /// `kubectl cordon`.
    Cordon,
    /// `kubectl uncordon`.
    Uncordon,
    /// The node's report: `GpuHealthy` `False`.
    Fail,
    /// The node's report: `GpuHealthy` `True`.
    Recover,
    /// The node's report: a pod holds a Slurm job's device.
    Clash,
}

/// One case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The action's name.
    pub action: &'static str,
    /// Where the node starts.
    pub from: Want,
    /// What starts the action.
    pub trigger: Step,
    /// The fault point.
    pub point: &'static str,
    /// The fault.
    pub fault: Fault,
    /// What changes while the task is down (or right after the lost answer).
    pub meanwhile: Step,
    /// Where it must end.
    pub want: Want,
}

const fn case(
    action: &'static str,
    from: Want,
    trigger: Step,
    point: &'static str,
    fault: Fault,
) -> Case {
    let want = match trigger {
        Step::Cordon => Want::Cordoned,
        Step::Fail => Want::HealthDrained,
        Step::Clash => Want::Evicted,
        _ => Want::Resumed,
    };
    Case {
        action,
        from,
        trigger,
        point,
        fault,
        meanwhile: Step::Nothing,
        want,
    }
}

const fn then(c: Case, meanwhile: Step, want: Want) -> Case {
    Case {
        meanwhile,
        want,
        ..c
    }
}

const CORDON: &str = "cordon → drain";
const UNCORDON: &str = "uncordon → resume";
const FAIL: &str = "health failure → drain + taint";
const RECOVER: &str = "recovery → resume";
const CLASH: &str = "device clash → eviction";
use Fault::{Crash, LoseAnswer};
use Step::{Clash, Cordon, Fail, Recover, Uncordon};
use Want::{Cordoned, HealthDrained, Resumed};

/// Every case, in order.
pub const CASES: &[Case] = &[
    case(
        CORDON,
        Resumed,
        Cordon,
        "nodesync/record-intent/done",
        Crash,
    ),
    case(
        CORDON,
        Resumed,
        Cordon,
        "nodesync/record-intent/done",
        LoseAnswer,
    ),
    case(CORDON, Resumed, Cordon, "nodesync/drain/done", Crash),
    case(CORDON, Resumed, Cordon, "nodesync/drain/done", LoseAnswer),
    case(CORDON, Resumed, Cordon, "nodesync/record-drain/done", Crash),
    case(CORDON, Resumed, Cordon, "nodesync/condition/done", Crash),
    then(
        case(
            CORDON,
            Resumed,
            Cordon,
            "nodesync/record-intent/done",
            Crash,
        ),
        Uncordon,
        Resumed,
    ),
    then(
        case(CORDON, Resumed, Cordon, "nodesync/drain/done", Crash),
        Uncordon,
        Resumed,
    ),
    then(
        case(CORDON, Resumed, Cordon, "nodesync/drain/done", LoseAnswer),
        Uncordon,
        Resumed,
    ),
    case(UNCORDON, Cordoned, Uncordon, "nodesync/undrain/done", Crash),
    case(
        UNCORDON,
        Cordoned,
        Uncordon,
        "nodesync/undrain/done",
        LoseAnswer,
    ),
    case(
        UNCORDON,
        Cordoned,
        Uncordon,
        "nodesync/record-clear/done",
        Crash,
    ),
    case(
        UNCORDON,
        Cordoned,
        Uncordon,
        "nodesync/condition/done",
        Crash,
    ),
    then(
        case(UNCORDON, Cordoned, Uncordon, "nodesync/undrain/done", Crash),
        Cordon,
        Cordoned,
    ),
    case(FAIL, Resumed, Fail, "nodesync/record-intent/done", Crash),
    case(FAIL, Resumed, Fail, "nodesync/drain/done", Crash),
    case(FAIL, Resumed, Fail, "nodesync/drain/done", LoseAnswer),
    case(FAIL, Resumed, Fail, "nodesync/taint/done", Crash),
    case(FAIL, Resumed, Fail, "nodesync/taint/done", LoseAnswer),
    case(FAIL, Resumed, Fail, "nodesync/record-drain/done", Crash),
    then(
        case(FAIL, Resumed, Fail, "nodesync/drain/done", Crash),
        Recover,
        Resumed,
    ),
    case(
        RECOVER,
        HealthDrained,
        Recover,
        "nodesync/undrain/done",
        Crash,
    ),
    case(
        RECOVER,
        HealthDrained,
        Recover,
        "nodesync/undrain/done",
        LoseAnswer,
    ),
    case(
        RECOVER,
        HealthDrained,
        Recover,
        "nodesync/taint/done",
        Crash,
    ),
    case(
        RECOVER,
        HealthDrained,
        Recover,
        "nodesync/record-clear/done",
        Crash,
    ),
    case(CLASH, Resumed, Clash, "nodesync/evict/done", Crash),
    case(CLASH, Resumed, Clash, "nodesync/evict/done", LoseAnswer),
];

/// The cases that show the cordon/uncordon race of one pass: the drain sent, the Node uncordoned before the pass
/// that would record it, with and without a crash in between (run on every Slurm release).
pub const RACE: &[Case] = &[CASES[6], CASES[7], CASES[8]];

/// A Slurm site and the node sync for the cases.
#[allow(missing_debug_implementations)]
pub struct Lab {
    /// The API server, Slurm and the node sync.
    pub site: SyncSite,
}

impl Lab {
    /// Start on `release`; `fc2` drained by the administrator.
    pub fn start(release: SlurmRelease) -> Self {
        let site = SyncSite::start_on(release, &[NODE, ADMIN_DRAINED], args());
        site.slurm.run_ok(
            "scontrol",
            &[
                "update",
                &format!("NodeName={ADMIN_DRAINED}"),
                "State=DRAIN",
                &format!("Reason={ADMIN_REASON}"),
            ],
        );
        site.wait("the administrator's drain tainted", super::CONVERGE, || {
            site.tainted(ADMIN_DRAINED)
        });
        site.bound_pod(CLASH_POD, NODE, "{nvidia.com/gpu: \"1\"}");
        Self { site }
    }

    fn reason(&self) -> String {
        self.site
            .slurm
            .node(NODE)
            .get("Reason")
            .cloned()
            .unwrap_or_default()
    }

    fn drained(&self) -> bool {
        self.site.slurm.state(NODE).contains("DRAIN")
    }

    fn isthmus_taints(&self) -> Vec<String> {
        self.site.isthmus_taints(NODE)
    }

    fn condition_is(&self, status: &str) -> bool {
        self.site.condition(NODE).is_some_and(|c| c.0 == status)
    }

    fn record_is_empty(&self) -> bool {
        self.site
            .record(NODE)
            .is_none_or(|r| r["drain"].is_null() && r["sent"].is_null())
    }

    fn evictions(&self, since: SystemTime) -> usize {
        self.site
            .api
            .requests_by(&self.site.user(), since)
            .into_iter()
            .filter(|e| e.resource == "pods" && e.subresource == "eviction" && e.code < 300)
            .count()
    }

    /// Whether the node is where `want` says.
    pub fn is(&self, want: Want, since: SystemTime) -> bool {
        match want {
            Want::Cordoned => {
                self.drained()
                    && self.reason().starts_with(CORDON_REASON)
                    && self.site.drain_recorded(NODE)
                    && self.isthmus_taints().is_empty()
                    && self.condition_is("False")
            }
            Want::HealthDrained => {
                self.drained()
                    && self.reason().starts_with(HEALTH_REASON)
                    && self.site.drain_recorded(NODE)
                    && self.isthmus_taints() == ["isthmus.io/health-gpu"]
                    && self.condition_is("False")
            }
            Want::Resumed => {
                !self.drained()
                    && self.record_is_empty()
                    && self.isthmus_taints().is_empty()
                    && self.condition_is("True")
            }
            Want::Evicted => self.site.terminating(CLASH_POD) && self.evictions(since) == 1,
        }
    }

    fn step(&self, step: Step) {
        match step {
            Step::Nothing => {}
            Step::Cordon => {
                self.site.kubectl_ok(&["cordon", NODE]);
            }
            Step::Uncordon => {
                self.site.kubectl_ok(&["uncordon", NODE]);
            }
            Step::Fail => {
                self.site
                    .report_condition(NODE, "GpuHealthy", "False", "Xid79", GPU_FAILED);
            }
            Step::Recover => self.site.report_condition(
                NODE,
                "GpuHealthy",
                "True",
                "DevicesHealthy",
                "no failed gpu device",
            ),
            Step::Clash => self.site.report_condition(
                NODE,
                "DeviceAllocationConsistent",
                "False",
                "DeviceAllocationMismatch",
                &format!(
                    "pod clash/{CLASH_POD} holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job 12)"
                ),
            ),
        }
    }

    /// Bring the node to `want` through the unfaulted path (from wherever the last case left it).
    fn bring_to(&mut self, want: Want) {
        self.site.kubectl_ok(&["uncordon", NODE]);
        self.step(Step::Recover);
        self.site.report_condition(
            NODE,
            "DeviceAllocationConsistent",
            "True",
            "DeviceAllocationMatches",
            "",
        );
        let since = SystemTime::now();
        self.wait_for(Want::Resumed, since, "back to the start");
        match want {
            Want::Cordoned => self.step(Step::Cordon),
            Want::HealthDrained => self.step(Step::Fail),
            _ => return,
        }
        self.wait_for(want, since, "the case's start");
    }

    fn wait_for(&self, want: Want, since: SystemTime, what: &str) -> Duration {
        converge(
            &format!("{want:?}"),
            what,
            || self.is(want, since),
            || self.state(),
        )
    }

    /// What the cases look at, for a failure's message.
    fn state(&self) -> String {
        format!(
            "Slurm {} ({:?}), record {:?}, taints {:?}, condition {:?}, node sync running: {}",
            self.site.slurm.state(NODE),
            self.reason(),
            self.site.record(NODE),
            self.isthmus_taints(),
            self.site.condition(NODE),
            self.site.running()
        )
    }

    /// `kubectl cordon` and `kubectl uncordon` right after each other, `times` times, with no fault: how long after
    /// the last uncordon Slurm's node is undrained, and how long until nothing of the drain is left in Kubernetes
    /// either (the condition `True` again once Slurm's node answers its ping, the record gone).
    pub fn cordon_uncordon_without_pause(&mut self, times: usize) -> (Duration, Duration) {
        self.bring_to(Want::Resumed);
        for _ in 0..times {
            self.site.kubectl_ok(&["cordon", NODE]);
            self.site.kubectl_ok(&["uncordon", NODE]);
        }
        let start = Instant::now();
        // A drain may still be on its way: the node must end resumed, and stay so.
        let since = SystemTime::now();
        let undrained = converge(
            "cordon, uncordon",
            "Slurm's node undrained",
            || !self.drained(),
            || self.state(),
        );
        converge(
            "cordon, uncordon",
            "resumed",
            || self.is(Want::Resumed, since),
            || self.state(),
        );
        let resumed = start.elapsed();
        self.site.await_a_whole_pass();
        assert!(self.is(Want::Resumed, since), "drained again after a pass");
        (undrained, resumed)
    }

    /// Run `case`; panics when it does not converge within [`super::CONVERGE`] or the administrator's drain moved.
    pub fn run(&mut self, case: &Case) -> Outcome {
        self.bring_to(case.from);
        if case.trigger == Step::Clash {
            // A pod to evict, made afresh for each case.
            let _ = self.site.api.kubectl(&[
                "delete",
                "pod",
                "-n",
                "clash",
                CLASH_POD,
                "--grace-period=0",
                "--force",
            ]);
            self.site
                .bound_pod(CLASH_POD, NODE, "{nvidia.com/gpu: \"1\"}");
        }
        let since = SystemTime::now();
        arm(case.point, case.fault);
        self.step(case.trigger);
        await_fired(case.point, || {});
        self.step(case.meanwhile);
        let start = if case.fault == Fault::Crash {
            self.site.restart(args());
            Instant::now()
        } else {
            Instant::now()
        };
        let o = Outcome {
            action: case.action,
            point: case.point,
            fault: case.fault,
            meanwhile: match case.meanwhile {
                Step::Uncordon => "uncordoned",
                Step::Cordon => "cordoned again",
                Step::Recover => "recovered",
                _ => "",
            },
            converged: Duration::ZERO,
        };
        let name = o.name();
        converge(
            &name,
            &format!("{:?}", case.want),
            || self.is(case.want, since),
            || self.state(),
        );
        let converged = start.elapsed();
        assert!(
            self.site.slurm.state(ADMIN_DRAINED).contains("DRAIN")
                && self
                    .site
                    .slurm
                    .node(ADMIN_DRAINED)
                    .get("Reason")
                    .is_some_and(|r| r.starts_with(ADMIN_REASON)),
            "{name}: the administrator's drain of {ADMIN_DRAINED} moved: {:?}",
            self.site.slurm.node(ADMIN_DRAINED)
        );
        Outcome { converged, ..o }
    }
}
