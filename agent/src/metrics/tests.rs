use super::*;

#[test]
fn a_started_publication_exports_its_counters_at_zero() {
    // An alert on increase(isthmus_nrt_failures_total[10m]) sees the first failure only if the series was
    // there, at 0, before it.
    let m = Metrics::new();
    m.start_publication("nrt");
    let text = m.render();
    for suffix in [
        "writes_total",
        "skips_total",
        "failures_total",
        "restores_total",
        "yields_total",
    ] {
        assert!(
            text.lines().any(|l| l == format!("isthmus_nrt_{suffix} 0")),
            "isthmus_nrt_{suffix}:\n{text}"
        );
    }
    m.record_publication("nrt", Publication::Failed);
    assert!(
        m.render()
            .lines()
            .any(|l| l == "isthmus_nrt_failures_total 1")
    );
}
