//! Convergence after a fault at each step of each multi-step action, measured: every case of the fault-injection
//! suite (`isthmus_tests::faults`: the controller killed at a step and restarted, or one answer lost) against real
//! Slurm and the real API server, each timed from the restart (or the lost answer) until the cluster is where the
//! inputs say. Prints the markdown table `docs/benchmarks.md` holds. The node sync's cases run on Slurm 24.11, the
//! cordon/uncordon race on every release, placement's on 22.05.
//!
//! ```text
//! cargo build -p isthmus-tests --bin bench-convergence && target/debug/bench-convergence   # as root
//! ```

use isthmus_tests::faults::{self, Outcome, nodesync, placement};
use isthmus_tests::slurm_release::SlurmRelease;

fn main() {
    isthmus_tests::leftovers::checked(bench);
}

fn bench() {
    let _one = faults::serial();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for release in [SlurmRelease::V22_05, SlurmRelease::V26_05] {
        let mut lab = nodesync::Lab::start(release);
        for c in nodesync::RACE {
            let mut o = lab.run(c);
            eprintln!("{release:?}: {} {:?}", o.name(), o.converged);
            o.action = match release {
                SlurmRelease::V22_05 => "cordon → drain (Slurm 22.05)",
                _ => "cordon → drain (Slurm 26.05)",
            };
            outcomes.push(o);
        }
    }
    let mut lab = nodesync::Lab::start(SlurmRelease::V24_11);
    let race = lab.cordon_uncordon_without_pause(3);
    for c in nodesync::CASES {
        let o = lab.run(c);
        eprintln!("{} {:?}", o.name(), o.converged);
        outcomes.push(o);
    }
    drop(lab);
    let mut lab = placement::Lab::start(SlurmRelease::V22_05);
    for c in placement::CASES {
        let o = lab.run(c);
        eprintln!("{} {:?}", o.name(), o.converged);
        outcomes.push(o);
    }
    drop(lab);
    println!(
        "cordon + uncordon with no pause (three times, Slurm 24.11): undrained in Slurm {:.2} s after the last \
         uncordon, nothing left in Kubernetes after {:.2} s\n",
        race.0.as_secs_f64(),
        race.1.as_secs_f64()
    );
    print!("{}", faults::table(&outcomes));
    let mut times: Vec<f64> = outcomes.iter().map(|o| o.converged.as_secs_f64()).collect();
    times.sort_by(f64::total_cmp);
    println!(
        "\n{} cases: median {:.2} s, max {:.2} s",
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
