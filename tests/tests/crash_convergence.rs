//! Every step of every multi-step action converges after the controller is killed at that step, or after the
//! answer to that step is lost: the fault-injection suite of `isthmus_tests::faults` against real Slurm and the real
//! API server (the node sync and placement running as the controller's ServiceAccount with the shipped RBAC). Each
//! case is named by action, step (the fault point in the code) and fault, and printed with its convergence time;
//! `bench-convergence` prints the same cases as the table in `docs/benchmarks.md`.
//!
//! The cordon/uncordon race (a drain sent, the Node uncordoned before the pass that would record it, with and
//! without a crash in between, and the two commands with no pause at all) runs on every Slurm release; the whole
//! node sync suite on 24.11 (whose resumed nodes keep their drain reason), placement's on 22.05.

use isthmus_tests::each_release;
use isthmus_tests::faults::{self, Outcome, nodesync, placement};
use isthmus_tests::slurm_release::SlurmRelease;

fn print(outcomes: &[Outcome]) {
    for o in outcomes {
        println!(
            "converged: {} in {:.2} s",
            o.name(),
            o.converged.as_secs_f64()
        );
    }
}

each_release! {
fn the_cordon_uncordon_race_leaves_no_drain_behind(release) {
    let _one = faults::serial();
    let mut lab = nodesync::Lab::start(release);
    let (undrained, resumed) = lab.cordon_uncordon_without_pause(3);
    println!(
        "cordon + uncordon with no pause, three times: undrained in Slurm {undrained:?}, nothing left {resumed:?} \
         after the last uncordon"
    );
    let outcomes: Vec<Outcome> = nodesync::RACE.iter().map(|c| lab.run(c)).collect();
    print(&outcomes);
    assert_eq!(outcomes.len(), 3);
}
}

/// Every point of `all` but `except` has a case among `covered`, and every case ran.
fn assert_covered(all: &[&str], covered: &[&str], except: &[&str], outcomes: &[Outcome]) {
    print(outcomes);
    let uncovered: Vec<&&str> = all
        .iter()
        .filter(|p| !covered.contains(p) && !except.contains(p))
        .collect();
    assert!(uncovered.is_empty(), "points without a case: {uncovered:?}");
    assert_eq!(outcomes.len(), covered.len());
}

#[test]
fn every_step_of_the_node_syncs_actions_converges() {
    let _one = faults::serial();
    let mut lab = nodesync::Lab::start(SlurmRelease::V24_11);
    let outcomes: Vec<Outcome> = nodesync::CASES.iter().map(|c| lab.run(c)).collect();
    let covered: Vec<&str> = nodesync::CASES.iter().map(|c| c.point).collect();
    // The old annotation's removal only repeats a write that has nothing to finish or undo.
    let except = ["nodesync/legacy-record/done"];
    assert_covered(
        isthmus_controller::nodesync::FAULT_POINTS,
        &covered,
        &except,
        &outcomes,
    );
}

#[test]
fn every_step_of_placements_actions_converges() {
    let _one = faults::serial();
    let mut lab = placement::Lab::start(SlurmRelease::V22_05);
    let outcomes: Vec<Outcome> = placement::CASES.iter().map(|c| lab.run(c)).collect();
    let covered: Vec<&str> = placement::CASES.iter().map(|c| c.point).collect();
    assert_covered(
        isthmus_controller::placement::FAULT_POINTS,
        &covered,
        &[],
        &outcomes,
    );
}
