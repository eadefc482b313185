//! The Pod Security Standards' "restricted" profile, checked on a pod spec without a server: what Kubernetes'
//! PodSecurity admission (1.23+) enforces in a namespace labelled `pod-security.kubernetes.io/enforce:
//! restricted`, for clusters (and test servers) that predate it. Rules as the standard lists them
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>, "Baseline" and "Restricted").

use serde_yaml_ng::Value;

const VOLUME_KINDS: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];
const SAFE_SYSCTLS: [&str; 6] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
];

/// Every way `spec` (a PodSpec) breaks the "restricted" profile; empty when it complies.
pub fn restricted_violations(spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[key].as_bool() == Some(true) {
            out.push(format!("{key}: true"));
        }
    }
    for v in spec["volumes"].as_sequence().into_iter().flatten() {
        let kind = v
            .as_mapping()
            .into_iter()
            .flatten()
            .filter_map(|(k, _)| k.as_str())
            .find(|k| *k != "name");
        if !kind.is_some_and(|k| VOLUME_KINDS.contains(&k)) {
            out.push(format!("volume {:?} is of kind {kind:?}", v["name"]));
        }
    }
    for s in spec["securityContext"]["sysctls"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        let name = s["name"].as_str().unwrap_or_default();
        if !SAFE_SYSCTLS.contains(&name) {
            out.push(format!("sysctl {name}"));
        }
    }
    let pod = &spec["securityContext"];
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|k| spec[k].as_sequence().into_iter().flatten());
    for c in containers {
        let name = c["name"].as_str().unwrap_or("?");
        let sc = &c["securityContext"];
        // Container settings override the pod's.
        let either = |key: &str| match &sc[key] {
            Value::Null => &pod[key],
            v => v,
        };
        if sc["privileged"].as_bool() == Some(true) {
            out.push(format!("{name}: privileged"));
        }
        if sc["allowPrivilegeEscalation"].as_bool() != Some(false) {
            out.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        if either("runAsNonRoot").as_bool() != Some(true) {
            out.push(format!("{name}: runAsNonRoot is not true"));
        }
        if either("runAsUser").as_u64() == Some(0) {
            out.push(format!("{name}: runAsUser 0"));
        }
        let seccomp = either("seccompProfile")["type"].as_str();
        if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
            out.push(format!("{name}: seccompProfile {seccomp:?}"));
        }
        let caps = &sc["capabilities"];
        let dropped = caps["drop"].as_sequence().into_iter().flatten();
        if !dropped.filter_map(Value::as_str).any(|c| c == "ALL") {
            out.push(format!("{name}: capabilities do not drop ALL"));
        }
        for add in caps["add"].as_sequence().into_iter().flatten() {
            if add.as_str() != Some("NET_BIND_SERVICE") {
                out.push(format!("{name}: adds capability {add:?}"));
            }
        }
        if sc["procMount"].as_str().is_some_and(|m| m != "Default") {
            out.push(format!("{name}: procMount {:?}", sc["procMount"]));
        }
        for p in c["ports"].as_sequence().into_iter().flatten() {
            if p["hostPort"].as_u64().is_some_and(|h| h != 0) {
                out.push(format!("{name}: hostPort {:?}", p["hostPort"]));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Value {
        serde_yaml_ng::from_str(text).unwrap()
    }

    #[test]
    fn a_restricted_pod_passes_and_each_breach_is_named() {
        let ok = "securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}\n\
                  volumes: [{name: t, emptyDir: {}}]\n\
                  containers:\n- name: c\n  securityContext: {allowPrivilegeEscalation: false, \
                  capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}\n";
        assert_eq!(restricted_violations(&spec(ok)), Vec::<String>::new());
        let bad = "hostPID: true\nvolumes: [{name: h, hostPath: {path: /}}]\n\
                   containers:\n- name: c\n  securityContext: {runAsUser: 0, capabilities: {add: [SYS_ADMIN]}}\n";
        let v = restricted_violations(&spec(bad));
        assert_eq!(v.len(), 8, "{v:#?}");
    }
}
