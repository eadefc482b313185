//! What Slurm's `--json` answers (`squeue`, `scontrol show`) say went wrong, read the same by the controller and
//! the node agent. Pure.

/// The `errors` a `--json` answer carries (`[{"error": "...", "description": "..."}]`), as one line; `None` when it
/// has none. A 22.05 client of a 26.05 slurmctld exits 0 with `"errors": [{"error": "Unspecified error", ...}]` and
/// an empty list: that answer is no list.
pub fn json_errors(v: &serde_json::Value) -> Option<String> {
    let errors = v.get("errors")?.as_array()?;
    if errors.is_empty() {
        return None;
    }
    let text: Vec<String> = errors
        .iter()
        .map(|e| {
            let field = |k: &str| e.get(k).and_then(serde_json::Value::as_str).unwrap_or("");
            match (field("description"), field("error")) {
                ("", "") => e.to_string(),
                (d, "") => d.to_owned(),
                ("", x) => x.to_owned(),
                (d, x) => format!("{d}: {x}"),
            }
        })
        .collect();
    Some(text.join("; "))
}
