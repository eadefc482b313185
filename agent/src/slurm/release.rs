//! The Slurm release of the node's slurmd (`slurmd -V`, `slurm 26.05.0`), read once at start against its grammar
//! ([`SlurmVersion::parse`]) and logged, with what the agent's flags ask of slurmd that this release lacks (a
//! warning: it will not work) or what the release offers that the flags leave unused. The flags stay the operator's:
//! nothing here changes what the agent runs.

use std::path::PathBuf;
use std::time::Duration;

use isthmus_gres::SlurmVersion;

/// How long `slurmd -V` may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the agent's flags ask of slurmd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asked {
    /// `--slurmd-readyz`: slurmd's HTTP listener.
    pub(crate) readyz: bool,
    /// `--slurm-topology`: the dynamic node's `Topology=`.
    pub(crate) topology: bool,
    /// munged started by the agent (`--no-munged` not given).
    pub(crate) munged: bool,
}

/// One thing to say about the flags and the release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// A flag asks for what this release lacks.
    Lacks(String),
    /// The release has something the flags leave off.
    Offers(String),
}

/// What to say about `asked` on `release`.
pub(crate) fn notes(release: SlurmVersion, asked: Asked) -> Vec<Note> {
    let mut out = Vec::new();
    match (asked.readyz, release.has_slurmd_http()) {
        (true, false) => out.push(Note::Lacks(format!(
            "--slurmd-readyz is set but slurmd {release} serves no HTTP (26.05 and later): the agent will not be ready"
        ))),
        (false, true) => out.push(Note::Offers(format!(
            "slurmd {release} answers GET /readyz on its SlurmdPort: --slurmd-readyz makes the agent's readiness follow it"
        ))),
        _ => {}
    }
    if asked.topology && !release.has_topology_yaml() {
        out.push(Note::Lacks(format!(
            "--slurm-topology is set but slurmd {release} knows no node Topology= (25.05 and later)"
        )));
    }
    if !asked.munged && !release.has_auth_slurm() {
        out.push(Note::Lacks(format!(
            "--no-munged is set but slurmd {release} has no auth/slurm (23.11 and later): it needs a munged the site runs"
        )));
    }
    out
}

/// Read slurmd's release (`slurmd -V`, a child registered with the agent's `reaper`, whose `waitpid` would otherwise
/// take its exit) and log it with [`notes`]; `None` (and a warning) where it gives none.
pub(crate) async fn say(
    slurmd: PathBuf,
    asked: Asked,
    reaper: crate::slurm::supervisor::process::Reaper,
) -> Option<SlurmVersion> {
    let mut cmd = tokio::process::Command::new(&slurmd);
    cmd.arg("-V")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let (child, _registered) = match reaper.spawn_foreign(&mut cmd) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(slurmd = %slurmd.display(), error = %e, "slurmd -V did not run: the Slurm release is not known");
            return None;
        }
    };
    let text = match tokio::time::timeout(TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(Ok(out)) => {
            tracing::warn!(slurmd = %slurmd.display(), status = %out.status, "slurmd -V failed: the Slurm release is not known");
            return None;
        }
        Ok(Err(e)) => {
            tracing::warn!(slurmd = %slurmd.display(), error = %e, "slurmd -V did not run: the Slurm release is not known");
            return None;
        }
        Err(_) => {
            tracing::warn!(slurmd = %slurmd.display(), "slurmd -V did not answer within {TIMEOUT:?}: the Slurm release is not known");
            return None;
        }
    };
    let release = match SlurmVersion::parse(&text) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(slurmd = %slurmd.display(), error = %e, "slurmd -V: the Slurm release is not known");
            return None;
        }
    };
    tracing::info!(%release, slurmd = %slurmd.display(), "Slurm release detected (slurmd -V)");
    for n in notes(release, asked) {
        match n {
            Note::Lacks(m) => tracing::warn!(%release, "{m}"),
            Note::Offers(m) => tracing::info!(%release, "{m}"),
        }
    }
    Some(release)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::supervisor::process::Reaper;

    fn v(text: &str) -> SlurmVersion {
        SlurmVersion::parse(text).unwrap()
    }

    const PLAIN: Asked = Asked {
        readyz: false,
        topology: false,
        munged: true,
    };

    #[test]
    fn flags_a_release_lacks_are_warned_of() {
        assert_eq!(notes(v("slurm-wlm 22.05.8"), PLAIN), []);
        assert_eq!(notes(v("slurm-wlm 24.11.5"), PLAIN), []);
        let all = Asked {
            readyz: true,
            topology: true,
            munged: false,
        };
        let old = notes(v("slurm-wlm 22.05.8"), all);
        assert_eq!(old.len(), 3, "{old:?}");
        assert!(old.iter().all(|n| matches!(n, Note::Lacks(_))), "{old:?}");
        let mid = notes(v("slurm-wlm 24.11.5"), all);
        assert_eq!(mid.len(), 2, "{mid:?}");
        assert_eq!(notes(v("slurm 26.05.0"), all), []);
    }

    #[test]
    fn what_a_release_offers_is_said() {
        let n = notes(v("slurm 26.05.0"), PLAIN);
        assert!(
            matches!(n.as_slice(), [Note::Offers(m)] if m.contains("--slurmd-readyz")),
            "{n:?}"
        );
    }

    #[test]
    fn read_from_slurmd_or_none() {
        use std::os::unix::fs::PermissionsExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let good = script(
            "good",
            "#!/bin/sh\n[ \"$1\" = -V ] && echo 'slurm-wlm 24.11.5'\n",
        );
        assert_eq!(
            rt.block_on(say(good, PLAIN, Reaper::default())),
            Some(v("slurm 24.11.5"))
        );
        let odd = script("odd", "#!/bin/sh\necho 'slurm 24.11.5; rm -rf /'\n");
        assert_eq!(rt.block_on(say(odd, PLAIN, Reaper::default())), None);
        let failing = script("failing", "#!/bin/sh\nexit 1\n");
        assert_eq!(rt.block_on(say(failing, PLAIN, Reaper::default())), None);
        assert_eq!(
            rt.block_on(say(dir.path().join("absent"), PLAIN, Reaper::default())),
            None
        );
    }
}
