//! A small machine for the Kubernetes side's unit tests.

use isthmus_topology::NodeTopology;

/// Two packages of two 2-thread cores each, Linux numbering interleaved across packages (CPUs 0 and 2 on package 0),
/// one NUMA node per package, sysfs `core_id` 0 and 1 in each package.
pub(crate) fn two_sockets() -> NodeTopology {
    let json = r#"{"version":2,"machine":{"cpu_source":"hwloc","packages":2,"cores":4,"cpus":8,"numa_nodes":2,
      "threads_per_core":2,"cpuset":"0-7","memory_bytes":0},
      "packages":[
        {"id":0,"cpuset":"0,2,4,6","cores":[{"logical":0,"id":0,"cpuset":"0,4"},{"logical":1,"id":1,"cpuset":"2,6"}]},
        {"id":1,"cpuset":"1,3,5,7","cores":[{"logical":2,"id":0,"cpuset":"1,5"},{"logical":3,"id":1,"cpuset":"3,7"}]}],
      "numa_nodes":[
        {"id":0,"cpuset":"0,2,4,6","memory_bytes":1024,"hugepages":[],"distances":[]},
        {"id":1,"cpuset":"1,3,5,7","memory_bytes":1024,"hugepages":[],"distances":[]}],
      "caches":[],"devices":[],"infiniband":[],"links":{"devices":[],"links":[]},
      "nvml":{"status":"not-needed"},"warnings":[]}"#;
    serde_json::from_str(json).unwrap()
}
