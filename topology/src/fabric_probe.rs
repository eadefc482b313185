//! The neighbour switch of each InfiniBand port, learned on the node: a directed-route SMP NodeInfo query sent out
//! of the port one hop (`smpquery -D -C <ca> -P <port> nodeinfo 0,<port>` from infiniband-diags). The node at the
//! other end of the cable answers with its node GUID, its type and the port the query arrived on (`LocalPort`):
//! for a host, that is the leaf switch and the switch port it is cabled to. The leaf switch is not in sysfs.
//!
//! The query sits behind [`NeighbourQuery`] so that discovery of a recorded tree never runs it; it is off unless
//! [`probe_neighbours`] is called. Every failure (no `smpquery`, no `/dev/infiniband/umad*`, no permission, a port
//! that does not answer within the timeout, a neighbour that is not a switch) is a warning, and such a port gets no
//! neighbour: never a guessed one.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::infiniband::{format_guid, parse_guid};
use crate::model::{IbNeighbour, NodeTopology};
use crate::warning::{Warning, WarningSource};

/// What a NodeInfo SMP answered, as `smpquery nodeinfo` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmpNodeInfo {
    /// `NodeType` (`Switch`, `Channel Adapter`, `Router`).
    pub(crate) node_type: String,
    /// `Guid`: the node GUID.
    pub(crate) node_guid: u64,
    /// `PortGuid`, when printed.
    pub(crate) port_guid: Option<u64>,
    /// `LocalPort`: the port of the answering node the query arrived on.
    pub(crate) local_port: u32,
}

impl SmpNodeInfo {
    /// Whether the answering node is a switch.
    pub(crate) fn is_switch(&self) -> bool {
        self.node_type.eq_ignore_ascii_case("switch")
    }
}

/// Why `smpquery nodeinfo` output could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeInfoError {
    /// A field the answer must have is absent or unreadable.
    #[error("smpquery nodeinfo output has no readable {0} field")]
    Missing(&'static str),
}

/// Read the `Field:.....value` lines of `smpquery nodeinfo` output.
pub(crate) fn parse_nodeinfo(text: &str) -> Result<SmpNodeInfo, NodeInfoError> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim_start_matches('.').trim().to_owned())
        })
    };
    let node_type = field("NodeType")
        .filter(|t| !t.is_empty())
        .ok_or(NodeInfoError::Missing("NodeType"))?;
    let node_guid = field("Guid")
        .as_deref()
        .and_then(parse_guid)
        .ok_or(NodeInfoError::Missing("Guid"))?;
    let local_port = field("LocalPort")
        .and_then(|p| p.parse().ok())
        .ok_or(NodeInfoError::Missing("LocalPort"))?;
    Ok(SmpNodeInfo {
        node_type,
        node_guid,
        port_guid: field("PortGuid").as_deref().and_then(parse_guid),
        local_port,
    })
}

/// Why one neighbour query failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The query tool cannot be started at all (absent, not executable): no port can be queried.
    #[error("cannot run {program}: {message}")]
    Unavailable {
        /// The program.
        program: String,
        /// What the OS said.
        message: String,
    },
    /// No answer within the timeout; the query was killed.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The tool ran and failed (no umad device, no permission, port down...).
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        /// The program.
        program: String,
        /// Its exit status.
        status: String,
        /// The end of its error output.
        stderr: String,
    },
    /// The answer could not be read.
    #[error(transparent)]
    Unreadable(#[from] NodeInfoError),
}

/// Something that can ask the node at the other end of a port for its NodeInfo.
pub trait NeighbourQuery {
    /// NodeInfo of the node cabled to `port` of InfiniBand device `ca`.
    fn node_info(&self, ca: &str, port: u32) -> Result<SmpNodeInfo, QueryError>;
}

/// The real query: `smpquery -D -C <ca> -P <port> nodeinfo 0,<port>`, killed after `timeout`.
#[derive(Debug, Clone)]
pub struct SmpQuery {
    /// The program (`smpquery`, looked up in `PATH`).
    pub program: PathBuf,
    /// How long one query may take before it is killed.
    pub timeout: Duration,
    /// Extra environment for the program (e.g. `LD_PRELOAD` of a fabric simulator's umad library).
    pub env: Vec<(OsString, OsString)>,
}

impl Default for SmpQuery {
    fn default() -> Self {
        Self {
            program: PathBuf::from("smpquery"),
            timeout: Duration::from_secs(2),
            env: Vec::new(),
        }
    }
}

/// Keep the last `max` bytes of a tool's error output, on one line.
fn tail(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = one_line.len().saturating_sub(max);
    let start = (start..one_line.len())
        .find(|&i| one_line.is_char_boundary(i))
        .unwrap_or(one_line.len());
    one_line[start..].to_owned()
}

impl NeighbourQuery for SmpQuery {
    fn node_info(&self, ca: &str, port: u32) -> Result<SmpNodeInfo, QueryError> {
        let program = self.program.display().to_string();
        let mut cmd = Command::new(&self.program);
        cmd.args(["-D", "-C", ca, "-P", &port.to_string(), "nodeinfo"])
            .arg(format!("0,{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| QueryError::Unavailable {
            program: program.clone(),
            message: e.to_string(),
        })?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(QueryError::TimedOut(self.timeout));
                }
            }
        };
        // nodeinfo prints well under a pipe buffer, so reading after exit cannot block the child.
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_end(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_end(&mut err);
        }
        if !status.success() {
            return Err(QueryError::Failed {
                program,
                status: status.to_string(),
                stderr: tail(&err, 300),
            });
        }
        Ok(parse_nodeinfo(&String::from_utf8_lossy(&out))?)
    }
}

/// Ask, for every InfiniBand port whose link is up, which switch port it is cabled to, and record the answer in
/// the port's `neighbour`. Ports whose query fails, or whose neighbour is not a switch, get no neighbour and a
/// warning; when the tool cannot be started the remaining ports are not tried.
pub fn probe_neighbours(topo: &mut NodeTopology, query: &dyn NeighbourQuery) {
    let mut warnings = Vec::new();
    'devices: for dev in &mut topo.infiniband {
        for port in &mut dev.ports {
            port.neighbour = None;
            if !port.is_infiniband() || !port.link_is_up() {
                continue;
            }
            let path = format!("/sys/class/infiniband/{}/ports/{}", dev.name, port.port);
            match query.node_info(&dev.name, port.port) {
                Ok(info) if info.is_switch() => {
                    port.neighbour = Some(IbNeighbour {
                        node_guid: format_guid(info.node_guid),
                        port: info.local_port,
                    });
                }
                Ok(info) => warnings.push(Warning::new(
                    WarningSource::Infiniband,
                    Some(&path),
                    format!(
                        "the neighbour {} is a {}, not a switch; no leaf switch recorded",
                        format_guid(info.node_guid),
                        info.node_type
                    ),
                )),
                Err(e @ QueryError::Unavailable { .. }) => {
                    warnings.push(Warning::new(
                        WarningSource::Infiniband,
                        None,
                        format!("neighbour switches not learned: {e}"),
                    ));
                    break 'devices;
                }
                Err(e) => warnings.push(Warning::new(
                    WarningSource::Infiniband,
                    Some(&path),
                    format!("neighbour switch not learned: {e}"),
                )),
            }
        }
    }
    topo.warnings.extend(warnings);
    topo.warnings.sort();
    topo.warnings.dedup();
}

/// Copy the neighbours learned on an earlier discovery of this node into a fresh one, for every port that is the
/// same port (device, port number and port GUID) and still up; the others get none. Discovery itself never learns
/// neighbours, so a node that probes less often than it discovers keeps publishing what it last learned instead
/// of flapping between "learned" and "unknown".
pub fn carry_neighbours(from: &NodeTopology, to: &mut NodeTopology) {
    for dev in &mut to.infiniband {
        let Some(old) = from.infiniband.iter().find(|d| d.name == dev.name) else {
            continue;
        };
        for port in &mut dev.ports {
            port.neighbour = old
                .ports
                .iter()
                .find(|p| p.port == port.port && p.port_guid() == port.port_guid())
                .filter(|_| port.is_infiniband() && port.link_is_up())
                .and_then(|p| p.neighbour.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `smpquery -D -C ibsim0 -P 1 nodeinfo 0,1` against ibsim's `net.2sw2path4hca2port` example (Hca1 port 1 is
    /// cabled to Switch1 port 1), as infiniband-diags 44.0 printed it.
    const IBSIM_SWITCH: &str = "# Node info: DR path slid 65535; dlid 65535; 0,1
BaseVers:........................1
ClassVers:.......................1
NodeType:........................Switch
NumPorts:........................8
SystemGuid:......................0x0000000000200000
Guid:............................0x0000000000200000
PortGuid:........................0x0000000000200000
PartCap:.........................8
DevId:...........................0x0000
Revision:........................0x000000a1
LocalPort:.......................1
VendorId:........................0x000000
";

    #[test]
    fn reads_a_switch_answer() {
        let info = parse_nodeinfo(IBSIM_SWITCH);
        assert_eq!(
            info,
            Ok(SmpNodeInfo {
                node_type: "Switch".into(),
                node_guid: 0x20_0000,
                port_guid: Some(0x20_0000),
                local_port: 1,
            })
        );
        assert!(info.is_ok_and(|i| i.is_switch()));
        assert_eq!(
            parse_nodeinfo(&IBSIM_SWITCH.replace("LocalPort", "Local")),
            Err(NodeInfoError::Missing("LocalPort"))
        );
        assert_eq!(
            parse_nodeinfo("NodeType:....Channel Adapter\nGuid:....0x1\nLocalPort:....2\n")
                .map(|i| i.is_switch()),
            Ok(false)
        );
    }

    struct Fixed(Result<SmpNodeInfo, QueryError>);

    impl NeighbourQuery for Fixed {
        fn node_info(&self, _: &str, _: u32) -> Result<SmpNodeInfo, QueryError> {
            self.0.clone()
        }
    }

    fn one_port_topology(state: Option<u8>, phys: Option<u8>, layer: Option<&str>) -> NodeTopology {
        let json = serde_json::json!({
            "version": 1,
            "machine": {"cpu_source": "sysfs", "packages": 0, "cores": 0, "cpus": 0, "numa_nodes": 0,
                        "threads_per_core": 0, "cpuset": "", "memory_bytes": 0},
            "packages": [], "numa_nodes": [], "caches": [], "devices": [],
            "infiniband": [{"name": "mlx5_0", "ports": [{"port": 1, "state_id": state, "phys_state_id": phys,
                             "link_layer": layer}]}],
            "links": {"devices": [], "links": []},
            "nvml": {"status": "not-needed"},
            "warnings": []
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn records_switches_and_warns_otherwise() {
        let switch = parse_nodeinfo(IBSIM_SWITCH).unwrap();
        let mut topo = one_port_topology(Some(4), Some(5), Some("InfiniBand"));
        probe_neighbours(&mut topo, &Fixed(Ok(switch.clone())));
        assert_eq!(
            topo.infiniband[0].ports[0].neighbour,
            Some(IbNeighbour {
                node_guid: "0000:0000:0020:0000".into(),
                port: 1
            })
        );
        assert!(topo.warnings.is_empty());

        let mut ca = switch.clone();
        ca.node_type = "Channel Adapter".into();
        for (answer, expect) in [
            (Ok(ca), "not a switch"),
            (
                Err(QueryError::TimedOut(Duration::from_secs(2))),
                "no answer",
            ),
            (
                Err(QueryError::Unavailable {
                    program: "smpquery".into(),
                    message: "No such file or directory".into(),
                }),
                "cannot run smpquery",
            ),
        ] {
            let mut topo = one_port_topology(Some(4), Some(5), Some("InfiniBand"));
            probe_neighbours(&mut topo, &Fixed(answer));
            assert_eq!(topo.infiniband[0].ports[0].neighbour, None);
            assert!(
                topo.warnings.iter().any(|w| w.message.contains(expect)),
                "{:?}",
                topo.warnings
            );
        }

        // RoCE and down ports are not queried.
        for topo in [
            one_port_topology(Some(4), Some(5), Some("Ethernet")),
            one_port_topology(Some(1), Some(3), Some("InfiniBand")),
        ] {
            let mut topo = topo;
            probe_neighbours(&mut topo, &Fixed(Ok(switch.clone())));
            assert_eq!(topo.infiniband[0].ports[0].neighbour, None);
            assert!(topo.warnings.is_empty());
        }
    }

    #[test]
    fn learned_neighbours_carry_over_to_the_same_port_while_it_is_up() {
        let switch = parse_nodeinfo(IBSIM_SWITCH).unwrap();
        let mut old = one_port_topology(Some(4), Some(5), Some("InfiniBand"));
        probe_neighbours(&mut old, &Fixed(Ok(switch)));
        let mut fresh = one_port_topology(Some(4), Some(5), Some("InfiniBand"));
        carry_neighbours(&old, &mut fresh);
        assert_eq!(
            fresh.infiniband[0].ports[0].neighbour,
            old.infiniband[0].ports[0].neighbour
        );
        let mut down = one_port_topology(Some(1), Some(3), Some("InfiniBand"));
        carry_neighbours(&old, &mut down);
        assert_eq!(down.infiniband[0].ports[0].neighbour, None);
    }

    #[test]
    fn a_missing_program_is_a_warning() {
        let q = SmpQuery {
            program: PathBuf::from("/nonexistent/smpquery"),
            ..SmpQuery::default()
        };
        let mut topo = one_port_topology(Some(4), Some(5), None);
        probe_neighbours(&mut topo, &q);
        assert_eq!(topo.infiniband[0].ports[0].neighbour, None);
        assert_eq!(topo.warnings.len(), 1);
    }

    proptest! {
        #[test]
        fn nodeinfo_parser_never_panics(s in ".*") {
            let _ = parse_nodeinfo(&s);
        }
    }
}
