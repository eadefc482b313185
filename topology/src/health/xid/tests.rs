use super::*;

fn table() -> XidTable {
    XidTable::builtin().unwrap_or_else(|e| panic!("built-in table: {e}"))
}

#[test]
fn the_builtin_table_is_versioned_and_complete() {
    let t = table();
    assert_eq!(t.version(), 1);
    // Every XID the three sources name (fixtures/xid/comparison.csv) has a row.
    let comparison = include_str!("../../../../fixtures/xid/comparison.csv");
    let mut named = 0;
    for l in comparison.lines().skip(1) {
        let f: Vec<&str> = l.split(',').collect();
        let xid: u32 = f[0].parse().unwrap_or_else(|e| panic!("{l}: {e}"));
        let e = t.entry(xid).unwrap_or_else(|| panic!("XID {xid} missing"));
        assert_eq!(e.action.as_str(), f[9], "XID {xid}");
        assert_eq!(e.disagreement, f[8] == "yes", "XID {xid}");
        named += 1;
    }
    assert_eq!(t.entries().count(), named);
    // Every disagreement says why.
    assert!(
        t.entries()
            .all(|(_, e)| !e.disagreement || !e.why.is_empty())
    );
}

#[test]
fn the_three_named_disagreements_have_their_chosen_actions() {
    let t = table();
    for (xid, action) in [
        (63, XidAction::Ignore),
        (68, XidAction::App),
        (109, XidAction::App),
    ] {
        let e = t.entry(xid).unwrap_or_else(|| panic!("XID {xid}"));
        assert!(e.disagreement, "XID {xid}");
        assert_eq!(e.action, action, "XID {xid}");
        assert!(!e.why.is_empty());
    }
}

#[test]
fn application_errors_never_drain() {
    let t = table();
    let recoveries = [
        None,
        Some(RecoveryAction::None),
        Some(RecoveryAction::GpuReset),
        Some(RecoveryAction::NodeReboot),
        Some(RecoveryAction::DrainP2p),
        Some(RecoveryAction::DrainAndReset),
    ];
    for xid in APPLICATION_XIDS {
        for r in recoveries {
            let v = t.classify(xid, r);
            assert_eq!(v.action, XidAction::App, "XID {xid} with {r:?}");
            assert!(!v.action.is_fatal());
        }
    }
    // Nor can an override make them drain: the whole file is refused.
    for xid in APPLICATION_XIDS {
        let err = table()
            .with_overrides(&format!("{xid},reset-gpu\n"))
            .err()
            .unwrap_or_else(|| panic!("XID {xid} accepted"));
        assert!(err.to_string().contains("application error"), "{err}");
    }
    // A table that makes one fatal is refused as well.
    let bad = "# version 2.\nxid,action,name,rule,disagreement,why\n13,reboot,X,nvs,no,\n";
    assert!(XidTable::parse(bad).is_err());
}

#[test]
fn fatal_xids_from_the_table() {
    let t = table();
    for (xid, action) in [
        (48, XidAction::ResetGpu),
        (79, XidAction::Reboot),
        (95, XidAction::ResetGpu),
        (119, XidAction::ResetGpu),
        (74, XidAction::Nvlink),
    ] {
        let v = t.classify(xid, None);
        assert_eq!(
            (v.action, v.source),
            (action, VerdictSource::Table),
            "XID {xid}"
        );
        assert!(v.action.is_fatal());
    }
    let v = t.classify(14, None);
    assert_eq!(v.action, XidAction::Ignore);
}

#[test]
fn the_recovery_action_takes_precedence() {
    let t = table();
    // XID 154 only announces a new recovery action: the action decides.
    let v = t.classify(154, Some(RecoveryAction::DrainAndReset));
    assert_eq!(v.action, XidAction::ResetGpu);
    assert_eq!(
        v.source,
        VerdictSource::Recovery(RecoveryAction::DrainAndReset)
    );
    assert_eq!(
        t.classify(154, Some(RecoveryAction::NodeReboot)).action,
        XidAction::Reboot
    );
    assert_eq!(
        t.classify(94, Some(RecoveryAction::DrainP2p)).action,
        XidAction::Nvlink
    );
    // An ignored XID the driver says needs a reset: reset.
    assert_eq!(
        t.classify(63, Some(RecoveryAction::GpuReset)).action,
        XidAction::ResetGpu
    );
    // "None" says nothing: the table decides.
    let v = t.classify(79, Some(RecoveryAction::None));
    assert_eq!(
        (v.action, v.source),
        (XidAction::Reboot, VerdictSource::Table)
    );
    assert_eq!(t.classify(154, None).action, XidAction::Ignore);
    // NVML's raw values.
    assert_eq!(
        RecoveryAction::from_raw(4),
        Some(RecoveryAction::DrainAndReset)
    );
    assert_eq!(RecoveryAction::from_raw(5), None);
}

#[test]
fn unknown_xids_are_ignored_unless_the_driver_says_otherwise() {
    let t = table();
    let v = t.classify(999, None);
    assert_eq!(
        (v.action, v.source),
        (XidAction::Ignore, VerdictSource::Unknown)
    );
    assert_eq!(
        t.classify(999, Some(RecoveryAction::GpuReset)).action,
        XidAction::ResetGpu
    );
}

#[test]
fn overrides_replace_table_rows() {
    let t = table()
        .with_overrides("# site policy\n\n63, reset-gpu, row remaps are rare here\n119,ignore\n")
        .unwrap();
    assert_eq!(t.override_count(), 2);
    let v = t.classify(63, None);
    assert_eq!(
        (v.action, v.source),
        (XidAction::ResetGpu, VerdictSource::Override)
    );
    assert_eq!(t.classify(119, None).action, XidAction::Ignore);
    // An override may make an application error quieter.
    let t = table().with_overrides("13,ignore\n").unwrap();
    assert_eq!(t.classify(13, None).action, XidAction::Ignore);
    // The driver still takes precedence over an override.
    let t = table().with_overrides("48,ignore\n").unwrap();
    assert_eq!(
        t.classify(48, Some(RecoveryAction::GpuReset)).action,
        XidAction::ResetGpu
    );
}

#[test]
fn bad_override_files_are_refused_with_the_line() {
    for (text, needle) in [
        ("63,drain\n", "line 1: \"drain\" is not an action"),
        ("# c\nx,ignore\n", "line 2: \"x\" is not an XID"),
        ("0,ignore\n", "outside"),
        ("5000,ignore\n", "outside"),
        ("63,ignore\n63,app\n", "line 2: XID 63 twice"),
        ("63\n", "line 1: \"\" is not an action"),
        ("-1,ignore\n", "not an XID"),
    ] {
        let err = table()
            .with_overrides(text)
            .err()
            .unwrap_or_else(|| panic!("{text:?} accepted"));
        assert!(err.to_string().contains(needle), "{text:?}: {err}");
    }
    let big = "# x\n".repeat(MAX_OVERRIDE_BYTES / 4 + 1);
    assert!(matches!(
        table().with_overrides(&big),
        Err(XidTableError::TooLarge(_))
    ));
}

#[test]
fn the_table_grammar_is_strict() {
    assert_eq!(
        XidTable::parse("xid,action,name,rule,disagreement,why\n"),
        Err(XidTableError::NoVersion)
    );
    assert!(XidTable::parse("# version 1.\nnot a header\n").is_err());
    assert!(
        XidTable::parse(
            "# version 1.\nxid,action,name,rule,disagreement,why\n5,reboot,X,nvs,yes,\n"
        )
        .is_err()
    );
    assert!(
        XidTable::parse("# version 1.\nxid,action,name,rule,disagreement,why\n5,reboot,X,nvs\n")
            .is_err()
    );
}
