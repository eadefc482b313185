//! Prometheus node metrics (metrics-exporter-prometheus with a recorder owned by the agent, not a global one):
//! device inventory, InfiniBand ports (node_exporter semantics, `isthmus_` prefix, base units), supervised children,
//! discovery and NRT publication; and the process metrics of client libraries ([`process`]).

use std::time::Duration;

use isthmus_topology::NodeTopology;
use metrics::{counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use metrics_util::MetricKindMask;

use crate::slurm::supervisor::ChildStatus;

mod gpu;
mod infiniband;
pub mod process;
mod publication;

pub use gpu::nvml_bus_id;
use infiniband::IB_COUNTERS;
pub use publication::Publication;

/// The agent's metrics.
#[derive(Debug)]
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// The handle renders the process's global recorder (the controller's), not `recorder`.
    global: bool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn describe() {
    describe_gauge!(
        "isthmus_gpu_utilization_ratio",
        "GPU utilisation (0-1), from NVML."
    );
    describe_gauge!(
        "isthmus_gpu_memory_used_bytes",
        "GPU frame-buffer memory in use, from NVML."
    );
    describe_gauge!(
        "isthmus_gpu_temperature_celsius",
        "GPU temperature, from NVML."
    );
    describe_gauge!("isthmus_gpu_power_watts", "GPU power draw, from NVML.");
    describe_gauge!(
        "isthmus_gpu_mig_memory_used_bytes",
        "Memory in use in a MIG device, from NVML."
    );
    describe_gauge!(
        "isthmus_gpu_mig_memory_total_bytes",
        "Memory of a MIG device's GPU instance, from NVML."
    );
    describe_gauge!(
        "isthmus_gpu_fabric_registered",
        "Whether the GPU completed its NVLink fabric registration (1), by state, from NVML."
    );
    describe_counter!(
        "isthmus_gpu_xid_errors_total",
        "Critical XID errors NVML reported for the GPU since the agent started."
    );
    describe_counter!(
        "isthmus_gpu_ecc_errors_total",
        "Aggregate ECC errors of the GPU, by type, from NVML."
    );
    describe_gauge!(
        "isthmus_device_info",
        "A discovered device (value 1), with kind, vendor, model, PCI address and NUMA node."
    );
    describe_gauge!("isthmus_machine_cpus", "Logical CPUs of the node.");
    describe_gauge!("isthmus_machine_memory_bytes", "Memory of all NUMA nodes.");
    describe_gauge!("isthmus_numa_node_memory_bytes", "Memory of a NUMA node.");
    describe_gauge!(
        "isthmus_infiniband_state_id",
        "Logical state of the port (4 = ACTIVE)."
    );
    describe_gauge!(
        "isthmus_infiniband_physical_state_id",
        "Physical state of the port (5 = LinkUp)."
    );
    describe_gauge!(
        "isthmus_infiniband_rate_bytes_per_second",
        "Signalling rate of the port."
    );
    for (_, suffix, _, help) in IB_COUNTERS {
        describe_counter!(format!("isthmus_infiniband_{suffix}"), *help);
    }
    describe_gauge!(
        "isthmus_discovery_duration_seconds",
        "Duration of the last discovery."
    );
    describe_gauge!(
        "isthmus_discovery_warnings",
        "Warnings of the last discovery, by probe."
    );
    describe_counter!("isthmus_discoveries_total", "Discoveries run.");
    describe_gauge!(
        "isthmus_device_allocation_mismatches",
        "Pods holding devices other than their placeholder job's, or a device a Slurm job holds."
    );
    describe_gauge!(
        "isthmus_device_health",
        "1 while the device (GPU PCI address, InfiniBand HCA/port) is sound, 0 while it has failed, per health class."
    );
    describe_counter!(
        "isthmus_health_xid_events_total",
        "XID events read, by the action the classification chose (app, ignore, reset-gpu, reboot, nvlink)."
    );
    describe_counter!(
        "isthmus_health_condition_writes_total",
        "Reports of changed or heartbeat health conditions to the node's NodeResourceTopology (result ok; the object's writes: isthmus_nrt_writes_total, isthmus_nrt_failures_total)."
    );
    describe_gauge!(
        "isthmus_slurm_jobs_confined",
        "Whether the Slurm jobs of the agent's slurmd are confined by Slurm's cgroup plugins (1) or not (0), with the \
         cgroup hierarchy and the reason (the Node condition SlurmJobsConfined)."
    );
    describe_gauge!(
        "isthmus_slurmd_refused",
        "1 while the agent does not start slurmd: the node serves its accelerators to pods and the Slurm jobs would \
         not be confined (without --slurm-allow-unconfined)."
    );
    describe_gauge!(
        "isthmus_supervised_child_up",
        "Whether the supervised child is running and ready."
    );
    describe_gauge!(
        "isthmus_supervised_child_crash_looping",
        "Whether the supervised child is crash-looping."
    );
    describe_counter!(
        "isthmus_supervised_child_restarts_total",
        "Restarts of the supervised child."
    );
    for (object, kind) in [
        ("nrt", "NodeResourceTopology"),
        ("numatopology", "Numatopology"),
        ("nodereport", "NodeReport"),
    ] {
        describe_counter!(
            format!("isthmus_{object}_writes_total"),
            format!("{kind} applies sent to the API server.")
        );
        describe_counter!(
            format!("isthmus_{object}_skips_total"),
            format!("{kind} updates skipped because nothing changed.")
        );
        describe_counter!(
            format!("isthmus_{object}_failures_total"),
            format!("{kind} applies that failed (retried with backoff).")
        );
        describe_counter!(
            format!("isthmus_{object}_restores_total"),
            format!("Times the live {kind} was deleted or edited by someone else and put back.")
        );
        describe_counter!(
            format!("isthmus_{object}_yields_total"),
            format!(
                "{kind} publications due but not written because another field manager owns the object."
            )
        );
        describe_gauge!(
            format!("isthmus_{object}_foreign_writer"),
            format!(
                "1 while another field manager (label manager) owns content of the node's {kind}: the agent does \
                 not write it then, unless --nrt-takeover; 0 once it is gone."
            )
        );
    }
}

impl Metrics {
    /// A recorder of our own; series not updated for 10 minutes (a removed device) disappear.
    pub(crate) fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(600)))
            .build_recorder();
        let handle = recorder.handle();
        let m = Self {
            recorder,
            handle,
            global: false,
        };
        m.with(describe);
        m.record_build_info();
        m
    }

    /// A registry whose recorder is the process's global one, for a process whose library code records through the
    /// `metrics` macros from any task (the controller). Fails when a global recorder is already installed.
    pub fn install_global() -> Result<Self, String> {
        let global = PrometheusBuilder::new().build_recorder();
        let handle = global.handle();
        metrics::set_global_recorder(global).map_err(|e| e.to_string())?;
        // `recorder` only serves the agent's own `record_*` calls, which the controller does not make.
        let recorder = PrometheusBuilder::new().build_recorder();
        let m = Self {
            recorder,
            handle,
            global: true,
        };
        m.record_build_info();
        Ok(m)
    }

    /// `isthmus_build_info{version,commit,arch} 1` in the registry `/metrics` renders (set again at each render,
    /// so that the agent's idle timeout never drops it).
    fn record_build_info(&self) {
        let record = || {
            describe_gauge!(
                crate::build_info::METRIC,
                "The binary: version, git commit, architecture (always 1)."
            );
            crate::build_info::record();
        };
        if self.global {
            record();
        } else {
            self.with(record);
        }
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.recorder, f)
    }

    /// Record what a discovery found and how long it took.
    pub(crate) fn record_discovery(&self, topo: &NodeTopology, took: Duration) {
        self.with(|| {
            counter!("isthmus_discoveries_total").increment(1);
            gauge!("isthmus_discovery_duration_seconds").set(took.as_secs_f64());
            gauge!("isthmus_machine_cpus").set(topo.machine.cpus as f64);
            gauge!("isthmus_machine_memory_bytes").set(topo.machine.memory_bytes as f64);
            for n in &topo.numa_nodes {
                gauge!("isthmus_numa_node_memory_bytes", "numa_node" => n.id.to_string())
                    .set(n.memory_bytes as f64);
            }
            let mut by_source = std::collections::BTreeMap::new();
            for w in &topo.warnings {
                *by_source.entry(w.source.as_str()).or_insert(0u32) += 1;
            }
            for source in [
                "hwloc",
                "cpu",
                "numa",
                "pci",
                "nvidia",
                "nvml",
                "accelerator",
                "infiniband",
                "machine",
            ] {
                gauge!("isthmus_discovery_warnings", "source" => source)
                    .set(f64::from(by_source.get(source).copied().unwrap_or(0)));
            }
            for d in &topo.devices {
                gauge!(
                    "isthmus_device_info",
                    "kind" => d.kind.as_str(),
                    "vendor" => d.vendor.clone(),
                    "model" => d.model.clone(),
                    "pci_address" => d.pci_address.clone(),
                    "numa_node" => d.numa_node.map_or_else(|| "none".to_owned(), |n| n.to_string()),
                )
                .set(1.0);
            }
            for ib in &topo.infiniband {
                for p in &ib.ports {
                    let labels = [("device", ib.name.clone()), ("port", p.port.to_string())];
                    if let Some(s) = p.state_id {
                        gauge!("isthmus_infiniband_state_id", &labels).set(f64::from(s));
                    }
                    if let Some(s) = p.phys_state_id {
                        gauge!("isthmus_infiniband_physical_state_id", &labels).set(f64::from(s));
                    }
                    if let Some(r) = p.rate_mbps {
                        gauge!("isthmus_infiniband_rate_bytes_per_second", &labels)
                            .set(r as f64 * 1e6 / 8.0);
                    }
                    for (name, suffix, mult, _) in IB_COUNTERS {
                        if let Some(v) = p.counters.get(*name) {
                            counter!(format!("isthmus_infiniband_{suffix}"), &labels)
                                .absolute(v.saturating_mul(*mult));
                        }
                    }
                }
            }
        });
    }

    /// Record the supervised children.
    pub(crate) fn record_children(&self, children: &[ChildStatus], crash_loop_after: u32) {
        self.with(|| {
            for c in children {
                let name = c.name.clone();
                gauge!("isthmus_supervised_child_up", "child" => name.clone()).set(if c.up {
                    1.0
                } else {
                    0.0
                });
                gauge!("isthmus_supervised_child_crash_looping", "child" => name.clone()).set(
                    if c.consecutive_failures >= crash_loop_after {
                        1.0
                    } else {
                        0.0
                    },
                );
                counter!("isthmus_supervised_child_restarts_total", "child" => name)
                    .absolute(c.restarts);
            }
        });
    }

    /// Record whether the Slurm jobs are confined (on hierarchy `cgroup`, for `reason`) and whether slurmd is
    /// refused for it.
    pub(crate) fn record_slurm_confinement(
        &self,
        cgroup: &'static str,
        reason: &'static str,
        confined: bool,
        refused: bool,
    ) {
        let one = |b: bool| if b { 1.0 } else { 0.0 };
        self.with(|| {
            gauge!("isthmus_slurm_jobs_confined", "cgroup" => cgroup, "reason" => reason)
                .set(one(confined));
            gauge!("isthmus_slurmd_refused").set(one(refused));
        });
    }

    /// Record NVML telemetry (DCGM-exporter's labels in snake case, as promtool's lint asks: `gpu`, `uuid`,
    /// `pci_bus_id`, `model_name`; `gpu` and `pci_bus_id` with DCGM-exporter's values, so that a join on either
    /// matches its series). MIG devices carry their parent's labels plus their instance ids, UUID and the
    /// profile the model names (`topo`, the last discovery).
    pub(crate) fn record_gpus(
        &self,
        snapshot: &isthmus_topology::nvml::NvmlSnapshot,
        topo: Option<&NodeTopology>,
    ) {
        self.with(|| {
            for g in &snapshot.gpus {
                gpu::record_mig(g, topo);
                if let Some(f) = &g.fabric {
                    gauge!(
                        "isthmus_gpu_fabric_registered",
                        "gpu" => g.index.to_string(),
                        "uuid" => g.uuid.clone().unwrap_or_default(),
                        "pci_bus_id" => nvml_bus_id(&g.pci_address),
                        "state" => f.state.as_str(),
                    )
                    .set(
                        if f.state == isthmus_topology::FabricState::Completed {
                            1.0
                        } else {
                            0.0
                        },
                    );
                }
                let labels = [
                    ("gpu", g.index.to_string()),
                    ("uuid", g.uuid.clone().unwrap_or_default()),
                    ("pci_bus_id", nvml_bus_id(&g.pci_address)),
                    ("model_name", g.name.clone().unwrap_or_default()),
                ];
                let t = &g.telemetry;
                if let Some(u) = t.utilization_percent {
                    gauge!("isthmus_gpu_utilization_ratio", &labels).set(f64::from(u) / 100.0);
                }
                if let Some(m) = t.memory_used_bytes {
                    gauge!("isthmus_gpu_memory_used_bytes", &labels).set(m as f64);
                }
                if let Some(c) = t.temperature_celsius {
                    gauge!("isthmus_gpu_temperature_celsius", &labels).set(f64::from(c));
                }
                if let Some(w) = t.power_watts {
                    gauge!("isthmus_gpu_power_watts", &labels).set(w);
                }
                if let Some(x) = t.xid_errors_total {
                    counter!("isthmus_gpu_xid_errors_total", &labels).absolute(x);
                }
                for (kind, v) in [
                    ("corrected", t.ecc_corrected_total),
                    ("uncorrected", t.ecc_uncorrected_total),
                ] {
                    if let Some(v) = v {
                        let mut l = labels.to_vec();
                        l.push(("type", kind.to_owned()));
                        counter!("isthmus_gpu_ecc_errors_total", &l).absolute(v);
                    }
                }
            }
        });
    }

    /// Pods whose devices disagree with Slurm's (the device plugin's check).
    pub(crate) fn record_device_mismatches(&self, pods: usize) {
        self.with(|| gauge!("isthmus_device_allocation_mismatches").set(pods as f64));
    }

    /// Device health: `devices` are (class, device, sound).
    pub(crate) fn record_health(&self, devices: &[(&'static str, String, bool)]) {
        self.with(|| {
            for (class, device, sound) in devices {
                gauge!("isthmus_device_health", "device" => device.clone(), "class" => *class)
                    .set(if *sound { 1.0 } else { 0.0 });
            }
        });
    }

    /// Count one health event: a classified XID (`isthmus_health_xid_events_total{action}`) or a condition write
    /// (`isthmus_health_condition_writes_total{result}`).
    pub(crate) fn record_health_event(
        &self,
        name: &'static str,
        label: &'static str,
        value: &'static str,
    ) {
        self.with(|| counter!(name, label => value).increment(1));
    }

    /// Count what a publication of one of the agent's objects did (`object`: `nrt`, `numatopology`).
    pub(crate) fn record_publication(&self, object: &str, outcome: Publication) {
        self.with(|| counter!(format!("isthmus_{object}_{}", outcome.suffix())).increment(1));
    }

    /// A publisher of `object` starts: each of its counters is exported, at 0 until something happens.
    pub(crate) fn start_publication(&self, object: &str) {
        self.with(|| {
            for outcome in Publication::ALL {
                counter!(format!("isthmus_{object}_{}", outcome.suffix())).increment(0);
            }
        });
    }

    /// The other writers of one of the agent's objects: `present` at 1, `gone` at 0 (`manager`: a name already
    /// made safe by the publisher).
    pub(crate) fn record_foreign_writers(&self, object: &str, present: &[String], gone: &[String]) {
        self.with(|| {
            let name = format!("isthmus_{object}_foreign_writer");
            for (managers, value) in [(present, 1.0), (gone, 0.0)] {
                for m in managers {
                    gauge!(name.clone(), "manager" => m.clone()).set(value);
                }
            }
        });
    }

    /// The exposition text, the process metrics (`process_*`, read from `/proc/self` now) last.
    pub(crate) fn render(&self) -> String {
        self.record_build_info();
        let mut text = self.handle.render();
        if !text.is_empty() && !text.ends_with("\n\n") {
            text.push('\n');
        }
        text.push_str(&process::render_self());
        text
    }
}

#[cfg(test)]
mod tests;
