//! The pacer's decisions as tables: what happened at which millisecond, and what it decides at a given one.

use super::*;

/// What happened.
#[derive(Debug, Clone, Copy)]
enum Step {
    Changed,
    /// The live object was deleted or changed by someone else.
    Undone,
    Written,
    Settled,
    /// Failed; retried at this millisecond.
    Failed(u64),
}

/// What it should decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Idle,
    Now,
    Until(u64),
}

struct Case {
    name: &'static str,
    steps: &'static [(u64, Step)],
    at: u64,
    want: Want,
}

const MIN_INTERVAL: Duration = Duration::from_millis(500);

fn ms(base: Instant, t: u64) -> Instant {
    base + Duration::from_millis(t)
}

fn replay(base: Instant, steps: &[(u64, Step)]) -> Pacer {
    let mut p = Pacer::new(MIN_INTERVAL);
    for &(t, step) in steps {
        match step {
            Step::Changed => p.changed(),
            Step::Undone => {
                p.restore(ms(base, t));
            }
            Step::Written => p.written(ms(base, t)),
            Step::Settled => p.settled(),
            Step::Failed(retry) => p.failed(ms(base, retry)),
        }
    }
    p
}

fn want(base: Instant, w: Want) -> Decision {
    match w {
        Want::Idle => Decision::Idle,
        Want::Now => Decision::WriteNow,
        Want::Until(t) => Decision::WaitUntil(ms(base, t)),
    }
}

use Step::{Changed, Failed, Settled, Undone, Written};

const CASES: &[Case] = &[
    Case {
        name: "the first publication is written at once",
        steps: &[],
        at: 0,
        want: Want::Now,
    },
    Case {
        name: "nothing pending after a write",
        steps: &[(0, Written)],
        at: 100,
        want: Want::Idle,
    },
    Case {
        name: "nothing pending when the object was already right",
        steps: &[(0, Settled)],
        at: 100,
        want: Want::Idle,
    },
    Case {
        name: "a change right after a quiet write is written at once (a burst of two)",
        steps: &[(0, Written), (100, Changed)],
        at: 100,
        want: Want::Now,
    },
    Case {
        name: "a third change within the interval waits until writes average one per interval",
        steps: &[(0, Written), (10, Written), (100, Changed)],
        at: 100,
        want: Want::Until(500),
    },
    Case {
        name: "changes during the wait coalesce: the deadline stays",
        steps: &[
            (0, Written),
            (10, Written),
            (100, Changed),
            (200, Changed),
            (450, Changed),
        ],
        at: 450,
        want: Want::Until(500),
    },
    Case {
        name: "at the interval's end the coalesced change is written",
        steps: &[(0, Written), (10, Written), (100, Changed), (200, Changed)],
        at: 500,
        want: Want::Now,
    },
    Case {
        name: "a steady stream is written once per interval",
        steps: &[(0, Written), (10, Written), (500, Written), (600, Changed)],
        at: 600,
        want: Want::Until(1000),
    },
    Case {
        name: "a quiet interval gives the burst back",
        steps: &[
            (0, Written),
            (10, Written),
            (2000, Written),
            (2010, Changed),
        ],
        at: 2010,
        want: Want::Now,
    },
    Case {
        name: "a change after the interval is written at once",
        steps: &[(0, Written), (700, Changed)],
        at: 700,
        want: Want::Now,
    },
    Case {
        name: "a publication that sent nothing starts no interval",
        steps: &[(0, Settled), (100, Changed)],
        at: 100,
        want: Want::Now,
    },
    Case {
        name: "after a failure nothing before the retry",
        steps: &[(0, Failed(1000))],
        at: 999,
        want: Want::Until(1000),
    },
    Case {
        name: "the retry is written when due",
        steps: &[(0, Failed(1000))],
        at: 1000,
        want: Want::Now,
    },
    Case {
        name: "a change does not cut a failure's backoff short",
        steps: &[(0, Failed(1000)), (300, Changed)],
        at: 300,
        want: Want::Until(1000),
    },
    Case {
        name: "a failed write starts no interval: its retry waits for its own instant",
        steps: &[(0, Written), (100, Changed), (500, Failed(600))],
        at: 550,
        want: Want::Until(600),
    },
    Case {
        name: "a success after failures leaves nothing pending",
        steps: &[(0, Failed(1000)), (1000, Failed(3000)), (3000, Written)],
        at: 3000,
        want: Want::Idle,
    },
    Case {
        name: "a restore is written at once, within the interval",
        steps: &[(0, Written), (100, Undone)],
        at: 100,
        want: Want::Now,
    },
    Case {
        name: "a restore is written at once, during a failure's backoff",
        steps: &[(0, Failed(5000)), (100, Undone)],
        at: 100,
        want: Want::Now,
    },
    Case {
        name: "a second restore within the quiet time waits min_interval × 2",
        steps: &[(0, Written), (100, Undone), (100, Written), (1000, Undone)],
        at: 1000,
        want: Want::Until(2000),
    },
    Case {
        name: "a change does not cut a slowed restore short",
        steps: &[
            (0, Written),
            (100, Undone),
            (100, Written),
            (1000, Undone),
            (1500, Changed),
        ],
        at: 1500,
        want: Want::Until(2000),
    },
    Case {
        name: "a restore after the quiet time is written at once again",
        steps: &[(0, Written), (100, Undone), (100, Written), (2100, Undone)],
        at: 2100,
        want: Want::Now,
    },
    Case {
        name: "the urgency of a restore ends with its write",
        steps: &[(0, Written), (50, Undone), (50, Written), (100, Changed)],
        at: 100,
        want: Want::Until(500),
    },
    Case {
        name: "the urgency of a restore ends with its failure",
        steps: &[
            (0, Written),
            (10, Written),
            (100, Undone),
            (100, Failed(200)),
        ],
        at: 200,
        want: Want::Until(500),
    },
];

#[test]
fn decisions() {
    let base = Instant::now();
    for case in CASES {
        let p = replay(base, case.steps);
        assert_eq!(
            p.decide(ms(base, case.at)),
            want(base, case.want),
            "{}",
            case.name
        );
    }
}

/// Restores every second: the first is written at once, each following one waits twice as long as the one
/// before, up to `min_interval × 2⁷`; a quiet time resets it.
#[test]
fn a_fight_with_another_writer_slows_restores_down() {
    let base = Instant::now();
    let mut p = Pacer::new(MIN_INTERVAL);
    let got: Vec<Restore> = (0..10).map(|i| p.restore(ms(base, i * 1000))).collect();
    let mut expected = vec![Restore::Now];
    for (i, factor) in [2, 4, 8, 16, 32, 64, 128, 128, 128].into_iter().enumerate() {
        let now = (i as u64 + 1) * 1000;
        expected.push(Restore::Slowed {
            fights: i as u32 + 1,
            at: ms(base, now + 500 * factor),
        });
    }
    assert_eq!(got, expected);
    assert_eq!(
        p.restore(ms(base, 9000 + 2000)),
        Restore::Now,
        "quiet again"
    );
}

/// The async loop's part, run on a simulated clock: apply each event at its time, and whenever the pacer says so,
/// write (which always succeeds here) at once or at the instant it waits for.
fn simulate(events: &[(u64, Step)], until: u64) -> Vec<u64> {
    let base = Instant::now();
    let mut p = Pacer::new(MIN_INTERVAL);
    let mut writes = Vec::new();
    let mut events = events.iter().peekable();
    let mut now = 0;
    loop {
        match p.decide(ms(base, now)) {
            Decision::WriteNow => {
                p.written(ms(base, now));
                writes.push(now);
                continue;
            }
            Decision::WaitUntil(t) => {
                let due = (t - base).as_millis() as u64;
                if events.peek().is_none_or(|(e, _)| *e > due) {
                    now = due;
                    continue;
                }
            }
            Decision::Idle => {}
        }
        let Some(&(t, step)) = events.next() else {
            break;
        };
        now = t;
        match step {
            Step::Changed => p.changed(),
            Step::Undone => {
                p.restore(ms(base, t));
            }
            other => panic!("not an event: {other:?}"),
        }
    }
    assert!(now <= until, "ran past {until}: {now}");
    writes
}

#[test]
fn a_burst_of_changes_is_written_at_once_then_once_per_interval() {
    // The first object at 0, then a change every 50 ms for a second, then one more at 3 s.
    let mut events: Vec<(u64, Step)> = (1..=20).map(|i| (i * 50, Changed)).collect();
    events.push((3000, Changed));
    assert_eq!(simulate(&events, 3000), vec![0, 50, 500, 1000, 3000]);
}

#[test]
fn a_restore_in_a_burst_is_written_at_once() {
    let events = [(100, Changed), (200, Undone), (300, Changed)];
    assert_eq!(simulate(&events, 1500), vec![0, 100, 200, 1000]);
}

/// Over any stretch the writes average at most one per interval, bursts of two included.
#[test]
fn writes_never_average_more_than_one_per_interval() {
    let events: Vec<(u64, Step)> = (1..=200).map(|i| (i * 37, Changed)).collect();
    let writes = simulate(&events, 10_000);
    for (i, &w) in writes.iter().enumerate() {
        for (j, &later) in writes.iter().enumerate().skip(i + 1) {
            // j - i writes after w: at least (j - i - 1) intervals later.
            assert!(
                later - w >= (j - i - 1) as u64 * 500,
                "writes {writes:?}: {w} and {later}"
            );
        }
    }
}
