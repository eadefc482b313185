//! The check of the pods' devices against Slurm's jobs ([`super::check`]): which pods disagree, and which placed
//! pod the kubelet is admitting.

use std::collections::BTreeMap;

use super::inventory;
use super::slurm_jobs::Holds;

fn pod(
    ns: &str,
    name: &str,
    resource: &str,
    ids: &[&str],
) -> crate::k8s::podresources::proto::PodResources {
    use crate::k8s::podresources::proto::{ContainerDevices, ContainerResources, PodResources};
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                topology: None,
            }],
            cpu_ids: vec![],
            memory: vec![],
        }],
    }
}

#[test]
fn the_check_names_pods_on_slurms_devices_or_not_on_their_jobs() {
    use super::check::mismatches;
    use crate::k8s::podresources::proto::ListPodResourcesResponse;
    let placed = |name: &str, id: &str| {
        isthmus_gres::comment::parse_comment(&format!("k8s:ns/{name}/{id}"))
            .unwrap_or_else(|| panic!("comment"))
    };
    let uid = "0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d";
    let holds = Holds {
        slurm: BTreeMap::from([("0000:9b:00.0".into(), 42)]),
        placeholders: BTreeMap::from([
            ("0000:19:00.0".into(), placed("good", uid)),
            ("0000:3b:00.0".into(), placed("moved", uid)),
            ("0000:4c:00.0".into(), placed("waiting", uid)),
        ]),
        // A job whose comment names a pod while the placement owners are unknown.
        unverified: BTreeMap::from([("0000:cb:00.0".into(), 43)]),
        ..Holds::default()
    };
    let list = ListPodResourcesResponse {
        pod_resources: vec![
            pod("ns", "good", "nvidia.com/gpu", &["0000:19:00.0"]),
            pod("ns", "moved", "nvidia.com/gpu", &["0000:bb:00.0"]),
            pod("ns", "waiting", "nvidia.com/gpu", &[]),
            pod("other", "intruder", "nvidia.com/gpu", &["0000:9b:00.0"]),
            pod("other", "plain", "nvidia.com/gpu", &["0000:db:00.0"]),
            pod("other", "nic", "example.com/nic", &["0000:9b:00.0"]),
            // Maybe the unchecked job's pod, maybe not: not reported (never evicted on a guess).
            pod("ns", "unchecked", "nvidia.com/gpu", &["0000:cb:00.0"]),
        ],
    };
    let got: Vec<(String, String, String)> = mismatches(&holds, &list)
        .into_iter()
        .map(|m| (m.namespace, m.name, m.message))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "ns".into(),
                "moved".into(),
                "holds 0000:bb:00.0 but its placeholder job holds 0000:3b:00.0".into()
            ),
            (
                "other".into(),
                "intruder".into(),
                "holds devices Slurm jobs hold: 0000:9b:00.0 (Slurm job 42)".into()
            ),
        ]
    );
    assert_eq!(mismatches(&Holds::default(), &list), vec![]);
}

#[test]
fn the_pod_being_admitted_is_told_by_the_kubelet_listing_it_without_devices() {
    use super::check::admitting;
    use crate::k8s::podresources::proto::ListPodResourcesResponse;
    let placed = |name: &str, id: &str| {
        isthmus_gres::comment::parse_comment(&format!("k8s:ns/{name}/{id}"))
            .unwrap_or_else(|| panic!("comment"))
    };
    let (ua, ub) = (
        "0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d",
        "1c6b6d63-63c9-4b5a-8d5b-4d3f7d6f2f9e",
    );
    // Two placeholder jobs of one GPU each; a third job of a gang.
    let holds = Holds {
        slurm: BTreeMap::new(),
        placeholders: BTreeMap::from([
            ("0000:19:00.0".into(), placed("a", ua)),
            ("0000:bb:00.0".into(), placed("b", ub)),
        ]),
        claims: BTreeMap::from([(ua.to_owned(), [7].into()), (ub.to_owned(), [8].into())]),
        ..Holds::default()
    };
    let list =
        |pods: Vec<crate::k8s::podresources::proto::PodResources>| ListPodResourcesResponse {
            pod_resources: pods,
        };
    let one = |id: &str| Some(std::collections::BTreeSet::from([id.to_owned()]));
    // Only a is bound (listed, no device yet): its job's GPU.
    assert_eq!(
        admitting(&holds, &list(vec![pod("ns", "a", "nvidia.com/gpu", &[])])),
        one("0000:19:00.0")
    );
    // a admitted and holding its GPU, b being admitted: b's.
    assert_eq!(
        admitting(
            &holds,
            &list(vec![
                pod("ns", "a", "nvidia.com/gpu", &["0000:19:00.0"]),
                pod("ns", "b", "nvidia.com/gpu", &[]),
                pod("other", "plain", "example.com/nic", &["0000:9b:00.0"]),
            ])
        ),
        one("0000:bb:00.0")
    );
    // Both waiting: it cannot be told.
    assert_eq!(
        admitting(
            &holds,
            &list(vec![
                pod("ns", "a", "nvidia.com/gpu", &[]),
                pod("ns", "b", "nvidia.com/gpu", &[]),
            ])
        ),
        None
    );
    // Neither listed: none.
    assert_eq!(admitting(&holds, &list(vec![])), None);
    // A second job whose comment copies a's (a user's): a's pod cannot be told from it.
    let copied = Holds {
        claims: BTreeMap::from([(ua.to_owned(), [7, 9].into()), (ub.to_owned(), [8].into())]),
        ..holds.clone()
    };
    assert_eq!(
        admitting(&copied, &list(vec![pod("ns", "a", "nvidia.com/gpu", &[])])),
        None
    );

    // The preference puts the admitted pod's job's GPU first, before another placeholder's.
    let topo = super::tests::gpus();
    let (mut inv, _) = inventory::inventory(&topo, &[], &|_: &str| true);
    let devs = inv.remove("nvidia.com/gpu").unwrap_or_default();
    let all: Vec<String> = devs.keys().cloned().collect();
    assert!(
        all.contains(&"0000:19:00.0".to_owned()) && all.contains(&"0000:bb:00.0".to_owned()),
        "{all:?}"
    );
    assert_eq!(
        inventory::preferred(&devs, &all, &[], 1, &holds, &Default::default()),
        ["0000:19:00.0"]
    );
    let b = std::collections::BTreeSet::from(["0000:bb:00.0".to_owned()]);
    assert_eq!(
        inventory::preferred(&devs, &all, &[], 1, &holds, &b),
        ["0000:bb:00.0"]
    );
}

/// A pod on another pod's placeholder job's device is a clash, as on a user's job's: a single pod's job names
/// another pod, a gang's job another namespace (or the pod is placed on its own). A gang's device held by a pod of
/// its namespace is the gang's.
#[test]
fn a_pod_on_another_pods_placeholder_device_is_a_clash() {
    use super::check::mismatches;
    use crate::k8s::podresources::proto::ListPodResourcesResponse;
    let placed = |ns: &str, name: &str, id: &str| {
        isthmus_gres::comment::parse_comment(&format!("k8s:{ns}/{name}/{id}"))
            .unwrap_or_else(|| panic!("comment"))
    };
    let (ua, ub, gang) = (
        "0b5a5c52-52b8-4a49-9c4a-3c2f6c5e1f8d",
        "1c6b6d63-63c9-4b5a-8d5b-4d3f7d6f2f9e",
        "g-00112233445566ff",
    );
    let holds = Holds {
        slurm: BTreeMap::new(),
        placeholders: BTreeMap::from([
            ("0000:19:00.0".into(), placed("ns", "a", ua)),
            ("0000:3b:00.0".into(), placed("ns", "b", ub)),
            ("0000:4c:00.0".into(), placed("team", "train", gang)),
            ("0000:5d:00.0".into(), placed("team", "train", gang)),
        ]),
        claims: BTreeMap::from([(ua.to_owned(), [7].into()), (ub.to_owned(), [8, 9].into())]),
        ..Holds::default()
    };
    let list = ListPodResourcesResponse {
        pod_resources: vec![
            // a on b's device (b's job claimed by two jobs: both named).
            pod("ns", "a", "nvidia.com/gpu", &["0000:3b:00.0"]),
            // An ordinary pod of another namespace on a's device.
            pod("other", "plain", "nvidia.com/gpu", &["0000:19:00.0"]),
            // Gang members (its namespace) on the gang's devices: not a mismatch.
            pod("team", "train-0", "nvidia.com/gpu", &["0000:4c:00.0"]),
            pod("team", "train-1", "nvidia.com/gpu", &["0000:5d:00.0"]),
            // Another namespace's pod on the gang's device (its job's claims unknown).
            pod("other", "squatter", "nvidia.com/gpu", &["0000:5d:00.0"]),
        ],
    };
    let got: Vec<(String, bool, String)> = mismatches(&holds, &list)
        .into_iter()
        .map(|m| {
            (
                format!("{}/{}", m.namespace, m.name),
                m.is_clash(),
                m.message,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "ns/a".into(),
                true,
                "holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm jobs 8, 9 for ns/b)".into()
            ),
            (
                "other/plain".into(),
                true,
                "holds devices Slurm jobs hold: 0000:19:00.0 (Slurm job 7 for ns/a)".into()
            ),
            (
                "other/squatter".into(),
                true,
                "holds devices Slurm jobs hold: 0000:5d:00.0 (a Slurm job for team/train)".into()
            ),
        ]
    );
    // A pod placed on its own is no gang member: a gang's device is a clash for it too.
    let own = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "ns",
            "b",
            "nvidia.com/gpu",
            &["0000:3b:00.0", "0000:4c:00.0"],
        )],
    };
    let holds_b = Holds {
        placeholders: BTreeMap::from([
            ("0000:3b:00.0".into(), placed("ns", "b", ub)),
            ("0000:4c:00.0".into(), placed("ns", "train", gang)),
        ]),
        ..holds.clone()
    };
    let got = mismatches(&holds_b, &own);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].is_clash(), "{got:?}");
    assert!(
        got[0]
            .message
            .ends_with("0000:4c:00.0 (a Slurm job for ns/train)"),
        "{got:?}"
    );
}

/// A new clash waits for Slurm's confirmation; clashes already reported and other mismatches stay meanwhile.
#[test]
fn only_new_clashes_wait_for_slurm() {
    use super::check::{Mismatch, has_new_clash, without_new_clashes};
    let m = |name: &str, message: &str| Mismatch {
        namespace: "ns".into(),
        name: name.into(),
        message: message.into(),
    };
    let old = m(
        "a",
        "holds devices Slurm jobs hold: 0000:19:00.0 (Slurm job 4)",
    );
    let new = m(
        "b",
        "holds devices Slurm jobs hold: 0000:3b:00.0 (Slurm job 5)",
    );
    let moved = m(
        "c",
        "holds 0000:4c:00.0 but its placeholder job holds 0000:5d:00.0",
    );
    let last = vec![old.clone()];
    assert!(!has_new_clash(&[old.clone(), moved.clone()], &last));
    assert!(has_new_clash(&[old.clone(), new.clone()], &last));
    assert!(has_new_clash(std::slice::from_ref(&new), &[]));
    assert_eq!(
        without_new_clashes(vec![old.clone(), new, moved.clone()], &last),
        vec![old, moved]
    );
}
