use super::*;

#[test]
fn slurm_22_05_shape() {
    let json = r#"{"meta":{},"errors":[],"jobs":[
      {"job_id":12,"name":"k8s-a","comment":"k8s:ns/a/u1","job_state":"RUNNING","state_reason":"None",
       "nodes":"n[1-2]","partition":"high","start_time":1700000000},
      {"job_id":13,"name":"x","job_state":"PENDING","state_reason":"Resources","nodes":"","partition":"low"}]}"#;
    let jobs = parse_jobs(json).unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0].id, 12);
    assert_eq!(jobs[0].comment, "k8s:ns/a/u1");
    assert!(jobs[0].is_running());
    assert_eq!(jobs[0].nodes, "n[1-2]");
    assert_eq!(jobs[1].reason, "Resources");
    assert_eq!(jobs[1].comment, "");
    assert!(!jobs[1].is_running() && !jobs[1].is_finished());
}

#[test]
fn slurm_23_11_shape() {
    let json = r#"{"jobs":[{"job_id":7,"job_state":["PREEMPTED","REQUEUED"],
      "start_time":{"set":true,"infinite":false,"number":5},"nodes":"n1"},{"name":"no id"}]}"#;
    let jobs = parse_jobs(json).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state, "PREEMPTED");
    assert!(jobs[0].is_finished());
}

/// Lines as squeue printed them for `list` (separator shown as `|` here).
#[test]
fn the_list_format() {
    let text = "1|CANCELLED|None|n0|all|root|0|(null)|1764300000|k8s:default/p0/uid-0|1\n\
                6|PENDING|Resources||all|nobody|65534|proj|1764300001|k8s:default/p5/uid-5|6\n\
                7|RUNNING|None|n[1-2]|high|daemon|1|(null)|1764300002|k8s:ns/g/g-0123456789abcdef|7\n"
        .replace('|', &SEP.to_string());
    let jobs = parse_list(&text).unwrap();
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    assert_eq!(jobs[0].id, 1);
    assert!(jobs[0].is_finished());
    assert_eq!(jobs[0].nodes, "n0");
    assert_eq!(jobs[1].reason, "Resources");
    assert_eq!(jobs[1].nodes, "");
    assert_eq!(
        (jobs[1].user.as_str(), jobs[1].uid.as_str()),
        ("nobody", "65534")
    );
    assert_eq!(jobs[1].account, "proj");
    assert_eq!(jobs[1].submitted, 1_764_300_001);
    assert!(!jobs[1].is_running() && !jobs[1].is_finished());
    assert!(jobs[2].is_running());
    assert_eq!(jobs[2].partition, "high");
    assert_eq!(jobs[2].comment, "k8s:ns/g/g-0123456789abcdef");
    assert_eq!(parse_list(""), Ok(Vec::new()));
    assert_eq!(parse_list("\n"), Ok(Vec::new()));
}

/// What squeue prints for a job of `user` whose comment is `comment`: the comment raw, as squeue prints it.
fn record(id: u64, state: &str, user: &str, uid: u32, comment: &str) -> String {
    format!("{id}|{state}|None|n1|all|{user}|{uid}|(null)|1764300000|")
        .replace('|', &SEP.to_string())
        + comment
        + &format!("{SEP}{id}\n")
}

/// A user's comment that forges other jobs' records, in every shape: never read as a record. A newline or a
/// separator anywhere in a comment refuses the whole answer (it is then read as JSON).
#[test]
fn no_comment_forges_a_record() {
    let forged = record(1, "RUNNING", "daemon", 1, "k8s:ghost/ghost/0000");
    let honest = record(3, "RUNNING", "daemon", 1, "k8s:ns/p/0000-aa");
    let attacks = [
        // A whole forged record after a newline, and the rest of the attacker's line.
        format!("x\n{}", forged.trim_end()),
        // The attacker's own line made whole first, then the forged record, then a copy of itself.
        format!("x{SEP}7\n{}\n7{SEP}RUNNING", forged.trim_end()),
        // The attacker's record replaced: a short first line, a whole one of the attacker's id after it.
        format!(
            "\n{}",
            record(7, "RUNNING", "daemon", 1, "k8s:ns/p/0000-aa").trim_end()
        ),
        // A separator: more fields.
        format!("k8s:ns/p/0000-aa{SEP}7"),
        // An empty line.
        "a\n\nb".to_owned(),
        // A carriage return before the newline.
        format!("x\r\n{}", forged.trim_end()),
    ];
    for comment in &attacks {
        let text = honest.clone() + &record(7, "PENDING", "nobody", 65534, comment);
        let r = parse_list(&text);
        assert!(r.is_err(), "{comment:?} was read: {r:?}");
    }
    // A comment with control characters but neither is read whole, and names no placeholder.
    let text = record(7, "PENDING", "nobody", 65534, "k8s:ns/p/0000-aa\r\t");
    let jobs = parse_list(&text).unwrap();
    assert_eq!(jobs[0].comment, "k8s:ns/p/0000-aa\r\t");
    assert_eq!(
        crate::placement::comment::parse_comment(&jobs[0].comment),
        None
    );
}

/// Any bytes: never a panic, and what is read is exactly what a line said.
#[test]
fn arbitrary_text_never_panics() {
    use proptest::prelude::*;
    proptest!(|(s in "[0-9a-zA-Z|\n \u{1f}]{0,200}")| {
        let _ = parse_list(&s.replace('|', &SEP.to_string()));
    });
}

#[test]
fn a_job_listed_twice_is_refused() {
    let text = record(5, "RUNNING", "a", 1, "c") + &record(5, "RUNNING", "a", 1, "c");
    assert_eq!(parse_list(&text), Err(FrameError::Twice(5)));
    let bad_state = record(5, "running", "a", 1, "c");
    assert!(parse_list(&bad_state).is_err());
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    assert!(parse_jobs("{").is_err());
    assert!(parse_jobs(r#"{"jobs":[1,"x",null]}"#).is_ok_and(|j| j.is_empty()));
    // A shape without a job list, and the answer of a 22.05 client refused by 26.05 (recorded): errors.
    assert!(parse_jobs(r#"{"meta":{},"nodes":[]}"#).is_err());
    let refused = include_str!(
        "../../../../fixtures/slurm-protocol/client-22.05-server-26.05-squeue-json.stdout"
    );
    let e = parse_jobs(refused).expect_err("refused");
    assert!(e.to_string().contains("Unspecified error"), "{e}");
}

#[test]
fn parsable() {
    assert_eq!(parse_parsable("42\n"), Some(42));
    assert_eq!(parse_parsable("42;cluster\n"), Some(42));
    assert_eq!(parse_parsable("Submitted"), None);
}
