use super::*;

const GOOD: &str = r#"
tenants:
  - name: team-a
    namespaces: [team-a, team-a-dev]
    user: nobody
    group: 65534
    accounts: [proj-a, proj-b]
    partitions: [gpu, debug]
    defaultPartition: debug
    qos: [normal, high]
    maxTime: "1-00:00:00"
    defaultTime: "01:00:00"
    maxNodes: 8
    extendedResources: {example.com/fpga: "fpga:u280"}
  - name: labelled
    namespaceSelector: {matchLabels: {slurm-tenant: b}}
    user: 1
    group: daemon
    allowSharing: true
"#;

fn good() -> Policy {
    parse(GOOD).unwrap()
}

#[test]
fn a_good_policy_reads_with_its_defaults() {
    let p = good();
    assert_eq!(p.tenants.len(), 2);
    let a = &p.tenants[0];
    assert_eq!((a.user.as_str(), a.group.as_str()), ("nobody", "65534"));
    assert_eq!(
        a.accounts.default.as_deref(),
        Some("proj-a"),
        "the first listed"
    );
    assert_eq!(a.partitions.default.as_deref(), Some("debug"));
    assert_eq!(a.default_time, Some(3600));
    let b = &p.tenants[1];
    assert_eq!((b.user.as_str(), b.group.as_str()), ("1", "daemon"));
    assert!(b.partitions.allowed.is_empty());
    assert_eq!(
        parse("").map(|p| p.tenants.len()),
        Ok(0),
        "an empty document has no tenant"
    );
}

#[test]
fn namespaces_find_their_tenant() {
    let p = good();
    assert_eq!(
        p.tenant_for("team-a-dev", None).map(|t| t.name.as_str()),
        Ok("team-a")
    );
    let labels: BTreeMap<String, String> = [("slurm-tenant".to_owned(), "b".to_owned())].into();
    assert_eq!(
        p.tenant_for("x", Some(&labels)).map(|t| t.name.as_str()),
        Ok("labelled")
    );
    let e = p.tenant_for("team-c", None).expect_err("none");
    assert!(e.contains("team-c") && e.contains("no tenant"), "{e}");
    let two = parse(
        "tenants:\n- {name: x, namespaceSelector: {matchLabels: {a: '1'}}, user: u, group: g}\n\
         - {name: y, namespaceSelector: {matchLabels: {b: '1'}}, user: v, group: g}\n",
    )
    .unwrap();
    let both: BTreeMap<String, String> = [
        ("a".to_owned(), "1".to_owned()),
        ("b".to_owned(), "1".to_owned()),
    ]
    .into();
    let e = two.tenant_for("n", Some(&both)).expect_err("ambiguous");
    assert!(e.contains("x, y"), "{e}");
}

#[test]
fn requests_inside_the_policy_are_submitted_and_others_refused_by_rule() {
    let p = good();
    let a = &p.tenants[0];
    let spec = a
        .evaluate(&Requested::default(), 1, Some("global"))
        .unwrap();
    assert_eq!(
        spec,
        SubmitSpec {
            user: "nobody".into(),
            group: "65534".into(),
            account: Some("proj-a".into()),
            partition: Some("debug".into()),
            qos: Some("normal".into()),
            time: Some(3600),
            constraint: None,
            switches: None,
            shared: false,
        }
    );
    let asked = Requested {
        partition: Some("gpu".into()),
        account: Some("proj-b".into()),
        qos: Some("high".into()),
        time: Some(7200),
        ..Requested::default()
    };
    let spec = a.evaluate(&asked, 8, None).unwrap();
    assert_eq!(
        (spec.partition.as_deref(), spec.time),
        (Some("gpu"), Some(7200))
    );
    for (req, nodes, rule) in [
        (
            Requested {
                partition: Some("root-only".into()),
                ..Requested::default()
            },
            1,
            "tenants[team-a].partitions",
        ),
        (
            Requested {
                account: Some("proj-z".into()),
                ..Requested::default()
            },
            1,
            "tenants[team-a].accounts",
        ),
        (
            Requested {
                qos: Some("top".into()),
                ..Requested::default()
            },
            1,
            "tenants[team-a].qos",
        ),
        (
            Requested {
                time: Some(2 * 86_400),
                ..Requested::default()
            },
            1,
            "tenants[team-a].maxTime",
        ),
        (Requested::default(), 9, "tenants[team-a].maxNodes"),
    ] {
        let e = a.evaluate(&req, nodes, None).expect_err(rule);
        assert!(e.contains(rule) && e.contains("refused"), "{e}");
    }
    // A tenant without partitions: --placement-partition, and no partition may be asked for.
    let b = &p.tenants[1];
    assert_eq!(
        b.evaluate(&Requested::default(), 1, Some("global"))
            .map(|s| s.partition),
        Ok(Some("global".into()))
    );
    let e = b
        .evaluate(
            &Requested {
                partition: Some("gpu".into()),
                ..Requested::default()
            },
            1,
            None,
        )
        .expect_err("none allowed");
    assert!(e.contains("allows none"), "{e}");
    assert!(b.runs_as("daemon", "1") && !b.runs_as("nobody", "65534"));
}

#[test]
fn bad_policies_name_the_field() {
    for (doc, field) in [
        (
            "tenants: [{name: a, namespaces: [a], user: root, group: g}]",
            "tenants[a].user",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: 0, group: g}]",
            "tenants[a].user",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: \"g\\nx\"}]",
            "tenants[a].group",
        ),
        (
            "tenants: [{name: a, user: u, group: g}]",
            "names no namespace",
        ),
        (
            "tenants: [{name: a, namespaceSelector: {matchLabels: {}}, user: u, group: g}]",
            "matchLabels",
        ),
        (
            "tenants: [{name: a, namespaces: [A_b], user: u, group: g}]",
            "tenants[a].namespaces",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: g, partitions: [\"x y\"]}]",
            "tenants[a].partitions",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: g, maxTime: forever}]",
            "tenants[a].maxTime",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: g, maxTime: '10', defaultTime: '20'}]",
            "defaultTime",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: g, maxNodes: 0}]",
            "tenants[a].maxNodes",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: g, extendedResources: {fpga: x}}]",
            "extendedResources",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: g, extendedResources: {a.io/f: 'X:1'}}]",
            "extendedResources",
        ),
        (
            "tenants: [{name: a, namespaces: [a], user: u, group: g, colour: red}]",
            "colour",
        ),
        (
            "tenants: [{name: a, namespaces: [x], user: u, group: g}, {name: b, namespaces: [x], user: v, group: g}]",
            "already",
        ),
        (
            "tenants: [{name: a, namespaces: [x], user: u, group: g}, {name: a, namespaces: [y], user: v, group: g}]",
            "second tenant",
        ),
        (
            "tenants: [{name: 'A', namespaces: [x], user: u, group: g}]",
            "tenants[0].name",
        ),
        ("tenants: {}", "not a policy"),
    ] {
        let e = parse(doc).expect_err(field);
        assert!(e.contains(field), "{doc}: {e}");
    }
}

#[test]
fn the_shipped_example_is_a_valid_policy() {
    let text =
        include_str!("../../../../deploy/controller/overlays/slurm/placement-policy.example.yaml");
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_yaml_ng::from_str(text).unwrap();
    assert_eq!(
        cm.metadata.name.as_deref(),
        Some("isthmus-placement-policy")
    );
    let doc = cm
        .data
        .as_ref()
        .and_then(|d| d.get(POLICY_KEY))
        .unwrap_or_else(|| panic!("no {POLICY_KEY}"));
    let p = parse(doc).unwrap();
    assert_eq!(p.tenants.len(), 1);
}

#[test]
fn sharing_needs_the_pod_and_the_tenant() {
    let p = good();
    let (a, b) = (&p.tenants[0], &p.tenants[1]);
    assert!(!a.allow_sharing && b.allow_sharing);
    let shared = Requested {
        shared: true,
        ..Requested::default()
    };
    let e = a
        .evaluate(&shared, 1, None)
        .expect_err("team-a may not share");
    assert!(e.contains("tenants[team-a].allowSharing is false"), "{e}");
    assert!(e.contains("slurm.isthmus.io/node-sharing=shared"), "{e}");
    assert!(b.evaluate(&shared, 1, None).is_ok_and(|s| s.shared));
    assert!(
        b.evaluate(&Requested::default(), 1, None)
            .is_ok_and(|s| !s.shared)
    );
    assert!(
        parse("tenants: [{name: x, namespaces: [x], user: 1, group: 1, allowSharing: maybe}]")
            .is_err()
    );
}
