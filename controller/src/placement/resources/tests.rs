use super::*;

fn pod(yaml: &str) -> Pod {
    serde_yaml_ng::from_str(yaml).unwrap()
}

fn plain() -> Translation<'static> {
    Translation::default()
}

#[test]
fn quantities() {
    assert_eq!(parse_milli("500m"), Some(500));
    assert_eq!(parse_milli("2"), Some(2000));
    assert_eq!(parse_milli("1.5"), Some(1500));
    assert_eq!(parse_milli("1Gi"), Some(1000 << 30));
    assert_eq!(parse_milli("100M"), Some(100_000_000_000));
    assert_eq!(parse_milli("x"), None);
    assert_eq!(parse_milli("1Qi"), None);
    assert_eq!(parse_milli(""), None);
}

#[test]
fn apps_init_containers_and_limits() {
    let p = pod(r#"
metadata: {name: a}
spec:
  initContainers: [{name: i, resources: {requests: {cpu: "3"}}}]
  containers:
    - {name: c, resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {nvidia.com/gpu: "1"}}}
    - {name: d, resources: {requests: {cpu: "1", memory: 100Mi}}}
    - {name: e, resources: {limits: {cpu: "1", memory: 1Mi}}}
"#);
    let r = resources(&p, &plain()).unwrap();
    assert_eq!(r.cpus, 3, "the init container's 3 CPUs exceed 2.5");
    assert_eq!(
        r.mem_mib, 1125,
        "limits count where a container requests nothing"
    );
    assert_eq!(r.gres.get("gpu"), Some(&1));
}

#[test]
fn sidecars_run_beside_the_app_and_overhead_is_added() {
    // Sidecar s (1 CPU) starts first, then init i (2 CPUs) runs beside it: peak 3. Apps 2 + sidecar 1 = 3, plus
    // overhead 0.5 → 3.5 → 4. Memory: apps 1 Gi + sidecar 1 Gi + 256 Mi overhead.
    let p = pod(r#"
metadata: {name: a}
spec:
  overhead: {cpu: 500m, memory: 256Mi}
  initContainers:
    - {name: s, restartPolicy: Always, resources: {requests: {cpu: "1", memory: 1Gi}}}
    - {name: i, resources: {requests: {cpu: "2", memory: 10Mi}}}
  containers:
    - {name: c, resources: {requests: {cpu: "2", memory: 1Gi}}}
"#);
    let r = resources(&p, &plain()).unwrap();
    assert_eq!((r.cpus, r.mem_mib), (4, 2304));
    // An init container larger than everything else sets the pod's amount.
    let p = pod(r#"
metadata: {name: a}
spec:
  initContainers:
    - {name: s, restartPolicy: Always, resources: {requests: {cpu: "1"}}}
    - {name: i, resources: {requests: {cpu: "6"}}}
  containers: [{name: c, resources: {requests: {cpu: "1"}}}]
"#);
    assert_eq!(resources(&p, &plain()).map(|r| r.cpus), Ok(7));
}

#[test]
fn mig_and_mapped_extended_resources() {
    let p = pod(r#"
metadata: {name: a}
spec:
  containers:
    - {name: c, resources: {limits: {nvidia.com/mig-1g.10gb: "2", example.com/fpga: "1"}}}
"#);
    let mig_only = pod(
        "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {nvidia.com/mig-1g.10gb: '2'}}}]}",
    );
    let e = resources(&mig_only, &plain()).expect_err("unmapped");
    assert!(
        e.contains("nvidia.com/mig-1g.10gb") && e.contains("--placement-mig-gpu-type"),
        "{e}"
    );
    let e = resources(&p, &plain()).expect_err("unmapped");
    assert!(e.contains("example.com/fpga"), "{e}");
    let extended: BTreeMap<String, String> =
        [("example.com/fpga".to_owned(), "fpga:u280".to_owned())].into();
    let t = Translation {
        extended: Some(&extended),
        mig_gpu_type: Some("nvidia_a100"),
    };
    let r = resources(&p, &t).unwrap();
    assert_eq!(r.gres.get("gpu:nvidia_a100_1g.10gb"), Some(&2));
    assert_eq!(r.gres.get("fpga:u280"), Some(&1));
    assert_eq!(r.cpus, 1, "at least one CPU");
    // Anything else with a domain is refused, naming itself.
    let p = pod(
        "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {acme.io/thing: '1'}}}]}",
    );
    let e = resources(&p, &t).expect_err("refused");
    assert!(
        e.contains("acme.io/thing") && e.contains("extendedResources"),
        "{e}"
    );
    let p = pod(
        "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {nvidia.com/mig-big: '1'}}}]}",
    );
    assert!(resources(&p, &t).is_err());
}

#[test]
fn what_is_not_translated_and_what_is_bad() {
    let p = pod(r#"
metadata: {name: a}
spec:
  containers:
    - {name: c, resources: {requests: {ephemeral-storage: 1Gi, hugepages-2Mi: 4Mi}}}
"#);
    assert_eq!(
        resources(&p, &plain()),
        Ok(Resources {
            cpus: 1,
            mem_mib: 0,
            gres: BTreeMap::new()
        })
    );
    let p = pod(
        "metadata: {name: a}\nspec: {containers: [{name: c, resources: {requests: {cpu: lots}}}]}",
    );
    assert!(resources(&p, &plain()).is_err());
    assert!(resources(&Pod::default(), &plain()).is_err(), "no spec");
}

#[test]
fn gres_grammar() {
    for ok in [
        "gpu",
        "gpu:a100",
        "gpu:nvidia_h100_80gb_hbm3_1g.10gb",
        "fpga:u-280",
    ] {
        assert!(is_gres(ok), "{ok}");
    }
    for bad in ["", "Gpu", "gpu:", "gpu:a:b", "gpu,x", "gpu a", "1gpu"] {
        assert!(!is_gres(bad), "{bad}");
    }
}
