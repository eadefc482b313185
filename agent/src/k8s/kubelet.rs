//! What the kubelet says about resource management (topology manager, CPU manager, reserved resources): its
//! configuration file and, where the file does not say, its command line (flags win over the file, as in the
//! kubelet), read through the host root. What neither says is unknown, never assumed.

use std::collections::BTreeMap;

use isthmus_topology::HostRoot;
use serde::Deserialize;

/// The kubelet's default configuration file (kubeadm's).
pub const DEFAULT_CONFIG: &str = "/var/lib/kubelet/config.yaml";

/// The parts of a `KubeletConfiguration` isthmus reads; unset fields are `None` (the kubelet's defaults apply).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KubeletConfig {
    /// `topologyManagerPolicy` (`none`, `best-effort`, `restricted`, `single-numa-node`).
    pub(crate) topology_manager_policy: Option<String>,
    /// `topologyManagerScope` (`container`, `pod`).
    pub(crate) topology_manager_scope: Option<String>,
    /// `cpuManagerPolicy` (`none`, `static`).
    pub(crate) cpu_manager_policy: Option<String>,
    /// `reservedSystemCPUs`, a cpuset such as `0,1`.
    #[serde(rename = "reservedSystemCPUs")]
    pub(crate) reserved_system_cpus: Option<String>,
    /// `kubeReserved`: resource name → quantity.
    pub(crate) kube_reserved: Option<BTreeMap<String, String>>,
    /// `systemReserved`: resource name → quantity.
    pub(crate) system_reserved: Option<BTreeMap<String, String>>,
    /// `cgroupDriver` (`cgroupfs`, `systemd`): how the pods' cgroups are named.
    pub(crate) cgroup_driver: Option<String>,
    /// `cgroupRoot`: the cgroup the pods' `kubepods` is made under.
    pub(crate) cgroup_root: Option<String>,
}

impl KubeletConfig {
    /// `self` with every field `flags` sets replaced (the kubelet lets flags override its configuration file).
    pub(crate) fn overridden_by(mut self, flags: &KubeletConfig) -> Self {
        let pick = |mine: &mut Option<String>, theirs: &Option<String>| {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        };
        pick(
            &mut self.topology_manager_policy,
            &flags.topology_manager_policy,
        );
        pick(
            &mut self.topology_manager_scope,
            &flags.topology_manager_scope,
        );
        pick(&mut self.cpu_manager_policy, &flags.cpu_manager_policy);
        pick(&mut self.reserved_system_cpus, &flags.reserved_system_cpus);
        pick(&mut self.cgroup_driver, &flags.cgroup_driver);
        pick(&mut self.cgroup_root, &flags.cgroup_root);
        if flags.kube_reserved.is_some() {
            self.kube_reserved.clone_from(&flags.kube_reserved);
        }
        if flags.system_reserved.is_some() {
            self.system_reserved.clone_from(&flags.system_reserved);
        }
        self
    }
}

/// Where the kubelet's settings were read, and so how far an unset field can be read as the kubelet's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletSettings {
    /// The configuration file merged with the command line's flags.
    pub(crate) config: KubeletConfig,
    /// The configuration file was read.
    pub(crate) from_file: bool,
    /// The kubelet's command line was read (its process is visible under the host root's `/proc`).
    pub(crate) from_command_line: bool,
}

impl KubeletSettings {
    /// Whether an unset field means the kubelet's default: only when both places it can be set were read (a
    /// policy not in the file may still be a flag, and a kubelet without a readable file may have flags).
    pub(crate) fn complete(&self) -> bool {
        self.from_file && self.from_command_line
    }
}

/// Topology manager settings: the kubelet's values verbatim, its defaults where it is known to use them, `None`
/// where they are unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopologyManager {
    /// `topologyManagerPolicy`.
    pub(crate) policy: Option<String>,
    /// `topologyManagerScope`.
    pub(crate) scope: Option<String>,
}

/// Read the kubelet configuration (a host path): `Ok(None)` when there is no such file, `Err` with the reason when
/// it cannot be read or parsed. An empty file reads as an empty configuration.
pub(crate) fn read_config(root: &HostRoot, path: &str) -> Result<Option<KubeletConfig>, String> {
    let text = match root.read_string(path) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if text.trim().is_empty() {
        return Ok(Some(KubeletConfig::default()));
    }
    serde_yaml_ng::from_str::<KubeletConfig>(&text)
        .map(Some)
        .map_err(|e| format!("{path}: {e}"))
}

/// The running kubelet's flags that isthmus reads, from `/proc/<pid>/cmdline` under the host root: `None` when no
/// kubelet process is visible there (the host's `/proc` is not mounted, or the kubelet runs elsewhere).
pub(crate) fn read_command_line(root: &HostRoot) -> Option<KubeletConfig> {
    let proc = root.join("/proc");
    let entries = std::fs::read_dir(&proc).ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if let Some(flags) = kubelet_flags(&args) {
            return Some(flags);
        }
    }
    None
}

/// The flags of `args` when it is a kubelet's command line (`kubelet ...` or `hyperkube kubelet ...`).
fn kubelet_flags(args: &[String]) -> Option<KubeletConfig> {
    let base = |a: &str| a.rsplit('/').next().unwrap_or(a).to_owned();
    let rest = match args {
        [first, rest @ ..] if base(first) == "kubelet" => rest,
        [first, second, rest @ ..] if base(first) == "hyperkube" && second == "kubelet" => rest,
        _ => return None,
    };
    let mut out = KubeletConfig::default();
    let mut it = rest.iter().peekable();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, v.to_owned()),
            None => match it.peek() {
                Some(v) if !v.starts_with("--") => (flag, it.next().cloned().unwrap_or_default()),
                _ => continue,
            },
        };
        match name {
            "topology-manager-policy" => out.topology_manager_policy = Some(value),
            "topology-manager-scope" => out.topology_manager_scope = Some(value),
            "cpu-manager-policy" => out.cpu_manager_policy = Some(value),
            "reserved-cpus" => out.reserved_system_cpus = Some(value),
            "cgroup-driver" => out.cgroup_driver = Some(value),
            "cgroup-root" => out.cgroup_root = Some(value),
            "kube-reserved" => out.kube_reserved = Some(key_values(&value)),
            "system-reserved" => out.system_reserved = Some(key_values(&value)),
            _ => {}
        }
    }
    Some(out)
}

/// `cpu=500m,memory=1Gi` → map.
fn key_values(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The kubelet's settings from its file (`path`, a host path) and its command line; warnings for what could not
/// be read.
pub fn read_settings(root: &HostRoot, path: &str) -> (KubeletSettings, Vec<String>) {
    let mut warnings = Vec::new();
    let (file, from_file) = match read_config(root, path) {
        Ok(Some(c)) => (c, true),
        Ok(None) => (KubeletConfig::default(), false),
        Err(e) => {
            warnings.push(format!("kubelet configuration: {e}"));
            (KubeletConfig::default(), false)
        }
    };
    let flags = read_command_line(root);
    let from_command_line = flags.is_some();
    let config = match &flags {
        Some(f) => file.overridden_by(f),
        None => file,
    };
    let settings = KubeletSettings {
        config,
        from_file,
        from_command_line,
    };
    if topology_manager(&settings).policy.is_none() {
        warnings.push(format!(
            "the kubelet's topology manager policy is unknown: {} (mount the kubelet's configuration file, or \
             the host's /proc to read its flags); the NodeResourceTopology leaves it out",
            match (from_file, from_command_line) {
                (false, false) => format!("no configuration file at {path} and no kubelet process visible"),
                (true, false) => format!("{path} does not set it and the kubelet's flags are not visible"),
                _ => "neither its file nor its flags say".to_owned(),
            }
        ));
    }
    (settings, warnings)
}

/// The topology manager settings: what the kubelet is set to, its defaults (`none`, `container`) when everything
/// it reads was read and nothing sets them, unknown otherwise.
pub fn topology_manager(settings: &KubeletSettings) -> TopologyManager {
    let known = |v: &Option<String>, default: &str| match v {
        Some(v) if !v.is_empty() => Some(v.clone()),
        _ if settings.complete() => Some(default.to_owned()),
        _ => None,
    };
    TopologyManager {
        policy: known(&settings.config.topology_manager_policy, "none"),
        scope: known(&settings.config.topology_manager_scope, "container"),
    }
}

/// The deprecated `topologyPolicies` value of an NRT (v1alpha1 names, for consumers older than top-level
/// attributes), as resource-topology-exporter writes it.
pub(crate) fn topology_policies(tm: &TopologyManager) -> Vec<String> {
    let name = match (tm.policy.as_deref(), tm.scope.as_deref()) {
        (Some("none"), _) => "None",
        (Some("best-effort"), _) => "BestEffort",
        (Some("restricted"), _) => "Restricted",
        (Some("single-numa-node"), Some("pod")) => "SingleNUMANodePodLevel",
        (Some("single-numa-node"), _) => "SingleNUMANodeContainerLevel",
        _ => return Vec::new(),
    };
    vec![name.to_owned()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(root: &HostRoot) -> (TopologyManager, Vec<String>) {
        let (s, w) = read_settings(root, DEFAULT_CONFIG);
        (topology_manager(&s), w)
    }

    fn tm(policy: &str, scope: &str) -> TopologyManager {
        TopologyManager {
            policy: Some(policy.into()),
            scope: Some(scope.into()),
        }
    }

    #[test]
    fn reads_policy_and_scope_and_says_when_it_does_not_know()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        // Nothing to read: unknown, with a warning.
        let (t, w) = settings(&root);
        assert_eq!(t, TopologyManager::default());
        assert_eq!(w.len(), 1, "{w:?}");
        std::fs::create_dir_all(dir.path().join("var/lib/kubelet"))?;
        let file = dir.path().join("var/lib/kubelet/config.yaml");
        // A file that does not set the policy, flags not visible: still unknown.
        std::fs::write(&file, "")?;
        assert_eq!(settings(&root).0, TopologyManager::default());
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n\
             cpuManagerPolicy: static\nreservedSystemCPUs: \"0,1\"\nkubeReserved:\n  cpu: 500m\n  memory: 1Gi\n",
        )?;
        let (t, w) = settings(&root);
        let file_only = TopologyManager {
            policy: Some("single-numa-node".into()),
            scope: None,
        };
        assert_eq!((t, w), (file_only, vec![]));
        let (s, _) = read_settings(&root, DEFAULT_CONFIG);
        assert_eq!(s.config.cpu_manager_policy.as_deref(), Some("static"));
        assert_eq!(s.config.reserved_system_cpus.as_deref(), Some("0,1"));
        std::fs::write(&file, "topologyManagerPolicy: [oops")?;
        let (t, w) = settings(&root);
        assert_eq!(t, TopologyManager::default());
        assert!(w.iter().any(|w| w.contains("config.yaml")), "{w:?}");
        Ok(())
    }

    #[test]
    fn flags_override_the_file_and_complete_it() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        let pid = dir.path().join("proc/4242");
        std::fs::create_dir_all(&pid)?;
        std::fs::create_dir_all(dir.path().join("proc/self"))?;
        std::fs::write(
            pid.join("cmdline"),
            b"/usr/bin/kubelet\0--config=/var/lib/kubelet/config.yaml\0--topology-manager-policy\0restricted\0\
              --reserved-cpus=0\0--kube-reserved=cpu=1,memory=1Gi\0",
        )?;
        // Flags alone: the policy they set; the scope, which a file could set, is unknown.
        let (t, w) = settings(&root);
        let restricted = TopologyManager {
            policy: Some("restricted".into()),
            scope: None,
        };
        assert_eq!((t, w), (restricted, vec![]));
        // A file and flags: flags win; what neither sets is the kubelet's default.
        std::fs::create_dir_all(dir.path().join("var/lib/kubelet"))?;
        std::fs::write(
            dir.path().join("var/lib/kubelet/config.yaml"),
            "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\ncpuManagerPolicy: static\n",
        )?;
        let (s, _) = read_settings(&root, DEFAULT_CONFIG);
        assert!(s.complete());
        assert_eq!(topology_manager(&s), tm("restricted", "pod"));
        assert_eq!(s.config.reserved_system_cpus.as_deref(), Some("0"));
        assert_eq!(
            s.config
                .kube_reserved
                .and_then(|r| r.get("cpu").cloned())
                .as_deref(),
            Some("1")
        );
        std::fs::write(pid.join("cmdline"), b"/usr/bin/kubelet\0--v=2\0")?;
        let (s, _) = read_settings(&root, DEFAULT_CONFIG);
        assert_eq!(topology_manager(&s), tm("single-numa-node", "pod"));
        std::fs::write(dir.path().join("var/lib/kubelet/config.yaml"), "")?;
        let (s, _) = read_settings(&root, DEFAULT_CONFIG);
        assert_eq!(topology_manager(&s), tm("none", "container"));
        Ok(())
    }

    #[test]
    fn only_a_kubelet_command_line_is_read() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(
            kubelet_flags(&args(&[
                "/usr/bin/kubelet-helper",
                "--topology-manager-policy=x"
            ]))
            .is_none()
        );
        let f = kubelet_flags(&args(&[
            "hyperkube",
            "kubelet",
            "--cpu-manager-policy=static",
        ]));
        assert_eq!(
            f.and_then(|f| f.cpu_manager_policy).as_deref(),
            Some("static")
        );
        let f = kubelet_flags(&args(&[
            "kubelet",
            "--cgroup-driver",
            "systemd",
            "--cgroup-root=/isthmus.slice",
        ]))
        .unwrap_or_default();
        assert_eq!(
            (f.cgroup_driver.as_deref(), f.cgroup_root.as_deref()),
            (Some("systemd"), Some("/isthmus.slice"))
        );
    }

    #[test]
    fn deprecated_policy_names() {
        assert_eq!(
            topology_policies(&tm("single-numa-node", "pod")),
            ["SingleNUMANodePodLevel"]
        );
        assert_eq!(
            topology_policies(&tm("single-numa-node", "container")),
            ["SingleNUMANodeContainerLevel"]
        );
        assert_eq!(
            topology_policies(&tm("best-effort", "container")),
            ["BestEffort"]
        );
        assert!(topology_policies(&TopologyManager::default()).is_empty());
    }
}
