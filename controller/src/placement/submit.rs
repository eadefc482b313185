//! The `sbatch` command line of a placeholder job, built only from validated values (names checked against their
//! grammar in [`super::annotations`] and [`super::policy`], numbers, the comment the controller writes), and how
//! the job is made to run as the tenant's user. Pure.
//!
//! The user switch is the one part that depends on the Slurm release ([`SubmitAs`]): up to 25.x the controller,
//! root, passes `sbatch --uid=<user> --gid=<group>`; where `--uid`/`--gid` are gone (26.05), `sbatch` itself runs as
//! the user (`setpriv --reuid --regid --clear-groups`), which needs the user and group to exist in the
//! controller's image (NSS) unless they are numbers, and munge then vouches for that uid. Which one is chosen from
//! the release `sbatch --version` prints unless the operator says ([`super::submit_method`]).

use super::annotations::format_time;
use super::comment::JobRef;
use super::policy::SubmitSpec;
use super::resources::Resources;

/// How a placeholder job is made to run as its tenant's user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SubmitAs {
    /// `sbatch --uid=<user> --gid=<group>`, run as root (Slurm 22.05 to 25.x).
    UidOption,
    /// `setpriv --reuid=<user> --regid=<group> --clear-groups sbatch …` (Slurm releases without `--uid`).
    Setpriv,
}

/// The command to run: a wrapper and its arguments before `sbatch` (empty for none), and sbatch's arguments
/// (without `--parsable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Command {
    /// `setpriv …` or nothing.
    pub(crate) wrapper: Vec<String>,
    /// sbatch's options.
    pub(crate) args: Vec<String>,
}

/// The command of a placeholder job for `job`: `nodes` nodes, each holding `res`, running `command`.
pub(crate) fn command(
    job: &JobRef,
    nodes: usize,
    res: &Resources,
    spec: &SubmitSpec,
    command: &str,
    how: SubmitAs,
) -> Command {
    let mut a = vec![
        format!("--job-name=k8s-{}-{}", job.namespace, job.name),
        format!("--comment={}", job.comment()),
    ];
    let wrapper = match how {
        SubmitAs::UidOption => {
            a.push(format!("--uid={}", spec.user));
            a.push(format!("--gid={}", spec.group));
            Vec::new()
        }
        SubmitAs::Setpriv => vec![
            "setpriv".to_owned(),
            format!("--reuid={}", spec.user),
            format!("--regid={}", spec.group),
            "--clear-groups".to_owned(),
        ],
    };
    a.extend([
        format!("--nodes={nodes}"),
        "--ntasks-per-node=1".to_owned(),
        format!("--cpus-per-task={}", res.cpus),
        // Always a memory size: without one, a site where memory is consumable gives the job the whole node.
        format!("--mem={}M", res.mem_mib.max(1)),
    ]);
    // Safe by default: the job holds its nodes alone unless its pod and tenant chose to share them.
    if !spec.shared {
        a.push("--exclusive".to_owned());
    }
    if !res.gres.is_empty() {
        let g: Vec<String> = res.gres.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        a.push(format!("--gres={}", g.join(",")));
    }
    let options = [
        ("account", spec.account.clone()),
        ("partition", spec.partition.clone()),
        ("qos", spec.qos.clone()),
        ("time", spec.time.map(format_time)),
        ("constraint", spec.constraint.clone()),
        ("switches", spec.switches.clone()),
    ];
    a.extend(
        options
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("--{k}={v}"))),
    );
    a.extend([
        "--output=/dev/null".to_owned(),
        "--chdir=/tmp".to_owned(),
        format!("--wrap=exec {command}"),
    ]);
    Command { wrapper, args: a }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SubmitSpec {
        SubmitSpec {
            user: "nobody".into(),
            group: "65534".into(),
            account: Some("proj".into()),
            partition: Some("gpu".into()),
            qos: None,
            time: Some(3600),
            constraint: None,
            switches: Some("1".into()),
            shared: false,
        }
    }

    fn job() -> JobRef {
        JobRef {
            namespace: "ns".into(),
            name: "a".into(),
            id: "0a-1b".into(),
        }
    }

    #[test]
    fn the_uid_option() {
        let res = Resources {
            cpus: 3,
            mem_mib: 1124,
            gres: [("gpu".to_owned(), 1)].into(),
        };
        let c = command(
            &job(),
            1,
            &res,
            &spec(),
            "sleep infinity",
            SubmitAs::UidOption,
        );
        assert!(c.wrapper.is_empty());
        assert_eq!(
            c.args,
            [
                "--job-name=k8s-ns-a",
                "--comment=k8s:ns/a/0a-1b",
                "--uid=nobody",
                "--gid=65534",
                "--nodes=1",
                "--ntasks-per-node=1",
                "--cpus-per-task=3",
                "--mem=1124M",
                "--exclusive",
                "--gres=gpu:1",
                "--account=proj",
                "--partition=gpu",
                "--time=0-01:00:00",
                "--switches=1",
                "--output=/dev/null",
                "--chdir=/tmp",
                "--wrap=exec sleep infinity",
            ]
        );
    }

    #[test]
    fn setpriv_runs_sbatch_as_the_user() {
        let c = command(
            &job(),
            2,
            &Resources::default(),
            &spec(),
            "true",
            SubmitAs::Setpriv,
        );
        assert_eq!(
            c.wrapper,
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=65534",
                "--clear-groups"
            ]
        );
        assert!(
            !c.args
                .iter()
                .any(|a| a.starts_with("--uid") || a.starts_with("--gid"))
        );
        assert!(c.args.contains(&"--mem=1M".to_owned()));
        assert!(c.args.contains(&"--nodes=2".to_owned()));
        assert!(c.args.contains(&"--exclusive".to_owned()));
        let shared = SubmitSpec {
            shared: true,
            ..spec()
        };
        let c = command(
            &job(),
            1,
            &Resources::default(),
            &shared,
            "true",
            SubmitAs::UidOption,
        );
        assert!(!c.args.contains(&"--exclusive".to_owned()), "{:?}", c.args);
    }
}
