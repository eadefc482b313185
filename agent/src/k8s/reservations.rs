//! The CPUs the kubelet keeps for the system, from its configuration, for kubelets that cannot say so themselves
//! (PodResources `GetAllocatableResources` exists from Kubernetes 1.21; a 1.20 kubelet answers only `List`).
//!
//! - `reservedSystemCPUs` (an explicit cpuset) is taken as it is.
//! - Otherwise, with `cpuManagerPolicy: static`, the kubelet reserves `ceil(kubeReserved.cpu + systemReserved.cpu)`
//!   CPUs and picks them the way its static policy picks any CPUs on an idle node (`takeByTopology`): whole
//!   sockets while at least a socket is needed, then whole cores, then single threads, lowest ids first.
//! - With the `none` policy no CPU is exclusive to anyone, and a CPU quantity reserved for the system is shared
//!   time, not a set of CPUs: nothing is subtracted per NUMA node.

use isthmus_api::quantity::Quantity;
use isthmus_topology::{CpuSet, NodeTopology};

use super::kubelet::{KubeletConfig, KubeletSettings};

/// What the kubelet's CPU manager does with CPUs, as far as its settings tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CpuManager {
    /// The CPUs it reserves.
    pub(crate) reserved: ReservedCpus,
    /// `Some(true)`: the static policy (containers may hold CPUs exclusively); `Some(false)`: none can; `None`:
    /// unknown.
    pub(crate) static_policy: Option<bool>,
}

impl CpuManager {
    /// The CPU manager `settings` describe on `topo`.
    pub(crate) fn of(topo: &NodeTopology, settings: &KubeletSettings) -> Self {
        let static_policy = match settings.config.cpu_manager_policy.as_deref() {
            Some(p) if !p.is_empty() => Some(p == "static"),
            _ if settings.complete() => Some(false),
            _ => None,
        };
        Self {
            reserved: reserved_cpus(topo, &settings.config),
            static_policy,
        }
    }

    /// The CPUs a container holds exclusively, of the `ids` PodResources `List` reports for it. A kubelet before
    /// 1.21 reports the shared pool for every container that holds none (and every CPU under the `none` policy);
    /// the shared pool always includes the reserved CPUs, which the static policy never gives a container, so ids
    /// that include one are the pool, not a holding.
    pub(crate) fn exclusive<'a>(&self, ids: &'a [i64]) -> &'a [i64] {
        let reserved = |c: &i64| u32::try_from(*c).is_ok_and(|c| self.reserved.cpus.contains(c));
        if self.static_policy == Some(false) || ids.iter().any(reserved) {
            &[]
        } else {
            ids
        }
    }
}

/// The CPUs the kubelet reserves, and why when the configuration could not be read as such.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReservedCpus {
    /// The reserved CPUs (empty: none).
    pub(crate) cpus: CpuSet,
    /// Why the reservation is not known exactly (a malformed value), for a warning.
    pub(crate) problem: Option<String>,
}

/// The CPUs `config` reserves on `topo`.
pub(crate) fn reserved_cpus(topo: &NodeTopology, config: &KubeletConfig) -> ReservedCpus {
    if let Some(list) = config
        .reserved_system_cpus
        .as_deref()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        return match CpuSet::parse_list(list) {
            Ok(cpus) => ReservedCpus {
                cpus,
                problem: None,
            },
            Err(e) => ReservedCpus {
                cpus: CpuSet::new(),
                problem: Some(format!("reservedSystemCPUs {list:?}: {e}")),
            },
        };
    }
    if config.cpu_manager_policy.as_deref() != Some("static") {
        return ReservedCpus::default();
    }
    let mut milli: i128 = 0;
    let mut problem = None;
    for (what, map) in [
        ("kubeReserved", &config.kube_reserved),
        ("systemReserved", &config.system_reserved),
    ] {
        if let Some(q) = map.as_ref().and_then(|m| m.get("cpu")) {
            match Quantity::parse(q) {
                Ok(q) => milli += q.nanos() / 1_000_000,
                Err(e) => problem = Some(format!("{what}.cpu {q:?}: {e}")),
            }
        }
    }
    // ceil(millicores / 1000), as the static policy rounds its reservation up to whole CPUs.
    let count = usize::try_from((milli.max(0) + 999) / 1000).unwrap_or(usize::MAX);
    ReservedCpus {
        cpus: take_by_topology(topo, count),
        problem,
    }
}

/// `count` CPUs as the kubelet's static policy takes them from an idle node: whole sockets, then whole cores, then
/// threads; lowest ids first.
fn take_by_topology(topo: &NodeTopology, count: usize) -> CpuSet {
    let mut taken: Vec<u32> = Vec::new();
    let mut left = count.min(topo.machine.cpuset.len());
    let mut packages: Vec<&isthmus_topology::Package> = topo.packages.iter().collect();
    packages.sort_by_key(|p| p.id);
    // Whole sockets while a whole socket is still needed.
    for p in &packages {
        if left >= p.cpuset.len() && !p.cpuset.is_empty() {
            taken.extend(p.cpuset.ids());
            left -= p.cpuset.len();
        }
    }
    // Whole cores, then threads, in socket order (cores without a socket last).
    let cores = packages
        .iter()
        .flat_map(|p| p.cores.iter())
        .chain(topo.unpackaged_cores.iter());
    let free = |c: &&isthmus_topology::Core| !c.cpuset.ids().iter().any(|i| taken.contains(i));
    let free_cores: Vec<&isthmus_topology::Core> = cores.filter(free).collect();
    for c in &free_cores {
        if left >= c.cpuset.len() && left > 0 {
            taken.extend(c.cpuset.ids());
            left -= c.cpuset.len();
        }
    }
    if left > 0 {
        // Threads of the cores on a socket already used first (the kubelet prefers socket affinity with what it
        // took), then in socket and core order, lowest CPU first within a core.
        let used_socket = |c: &isthmus_topology::Core| {
            packages.iter().any(|p| {
                p.cpuset.includes(&c.cpuset) && taken.iter().any(|t| p.cpuset.contains(*t))
            })
        };
        let mut order: Vec<&isthmus_topology::Core> = free_cores
            .iter()
            .copied()
            .filter(|c| c.cpuset.ids().iter().any(|i| !taken.contains(i)))
            .collect();
        order.sort_by_key(|c| !used_socket(c));
        let threads: Vec<u32> = order
            .iter()
            .flat_map(|c| c.cpuset.ids().iter().copied())
            .filter(|i| !taken.contains(i))
            .take(left)
            .collect();
        taken.extend(threads);
    }
    CpuSet::from_ids(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> NodeTopology {
        crate::k8s::test_topology::two_sockets()
    }

    fn config(yaml: &str) -> KubeletConfig {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn an_explicit_list_wins() {
        let r = reserved_cpus(
            &topo(),
            &config("reservedSystemCPUs: \"0,5\"\ncpuManagerPolicy: static\n"),
        );
        assert_eq!(r.cpus.ids(), &[0, 5]);
        assert_eq!(r.problem, None);
        let r = reserved_cpus(&topo(), &config("reservedSystemCPUs: \"x\"\n"));
        assert!(r.cpus.is_empty() && r.problem.is_some());
    }

    #[test]
    fn the_static_policy_takes_sockets_then_cores_then_threads() {
        let take = |milli: &str| {
            let c = config(&format!(
                "cpuManagerPolicy: static\nkubeReserved: {{cpu: {milli}}}\nsystemReserved: {{cpu: 0}}\n"
            ));
            reserved_cpus(&topo(), &c).cpus.ids().to_vec()
        };
        assert_eq!(take("500m"), vec![0]);
        assert_eq!(take("1"), vec![0]);
        // A whole core: both threads of core 0.
        assert_eq!(take("1100m"), vec![0, 4]);
        // A core, then a thread on the same socket.
        assert_eq!(take("3"), vec![0, 2, 4]);
        // A whole socket, then the first thread of the other.
        assert_eq!(take("5"), vec![0, 1, 2, 4, 6]);
        assert_eq!(take("6"), vec![0, 1, 2, 4, 5, 6]);
        assert_eq!(take("20"), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn the_shared_pool_is_not_a_holding() {
        let settings = |yaml: &str| KubeletSettings {
            config: config(yaml),
            from_file: true,
            from_command_line: true,
        };
        let m = CpuManager::of(
            &topo(),
            &settings("cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n"),
        );
        assert_eq!(m.exclusive(&[2, 6]), &[2, 6]);
        // A 1.20 kubelet lists the shared pool (which holds the reserved CPU 0) for a Burstable container.
        assert!(m.exclusive(&[0, 1, 3, 4, 5, 7]).is_empty());
        let none = CpuManager::of(&topo(), &settings(""));
        assert_eq!(none.static_policy, Some(false));
        assert!(none.exclusive(&[0, 1, 2, 3, 4, 5, 6, 7]).is_empty());
        let unknown = CpuManager::of(
            &topo(),
            &KubeletSettings {
                from_file: true,
                ..KubeletSettings::default()
            },
        );
        assert_eq!(
            (unknown.static_policy, unknown.exclusive(&[3])),
            (None, &[3][..])
        );
    }

    #[test]
    fn nothing_is_reserved_per_cpu_without_the_static_policy() {
        let r = reserved_cpus(&topo(), &config("kubeReserved: {cpu: \"2\"}\n"));
        assert!(r.cpus.is_empty());
        let r = reserved_cpus(
            &topo(),
            &config("cpuManagerPolicy: static\nkubeReserved: {cpu: lots}\n"),
        );
        assert!(r.cpus.is_empty() && r.problem.is_some());
    }
}
