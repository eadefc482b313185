//! How placeholder jobs are made their tenant's ([`SubmitAs`]): `--placement-submit-as` where the operator gave
//! it, else chosen from the Slurm release of the client tools (`sbatch --version`). The flag always wins over
//! detection. A release not known yet (a configless site's sbatch reads slurm.conf from slurmctld, which may be
//! down at start) is asked again before the next submission; until then a submission fails and is retried.

use std::sync::Arc;

use isthmus_gres::SlurmVersion;
use tokio::sync::OnceCell;

use super::submit::SubmitAs;
use crate::slurm::{SlurmClient, SlurmError};

/// The method a release calls for, and why: `sbatch --uid/--gid` where sbatch has them, else `setpriv`.
pub(crate) fn choose(release: SlurmVersion) -> (SubmitAs, &'static str) {
    if release.sbatch_has_uid() {
        (
            SubmitAs::UidOption,
            "this release's sbatch takes --uid/--gid",
        )
    } else {
        (
            SubmitAs::Setpriv,
            "sbatch --uid/--gid are gone in Slurm 26.05 and later",
        )
    }
}

/// The submit method: the flag's, or the detected one once the release is known.
#[derive(Debug, Clone, Default)]
pub(crate) struct SubmitMethod {
    explicit: Option<SubmitAs>,
    detected: Arc<OnceCell<SubmitAs>>,
}

impl SubmitMethod {
    /// `explicit`: `--placement-submit-as`, if given.
    pub(crate) fn new(explicit: Option<SubmitAs>) -> Self {
        Self {
            explicit,
            detected: Arc::default(),
        }
    }

    /// At start: read the release and log it with the method chosen and why (a flag that contradicts the release
    /// is kept, with a warning). A release not known yet is logged and asked again at the next submission.
    pub(crate) async fn start(&self, slurm: &SlurmClient) {
        match (self.explicit, slurm.release().await) {
            (Some(how), Ok(release)) => {
                let (fits, why) = choose(release);
                if fits == how {
                    tracing::info!(%release, submit_as = ?how, "placement: Slurm release detected (sbatch --version); submitting as --placement-submit-as says");
                } else {
                    tracing::warn!(%release, submit_as = ?how, detected = ?fits, why, "placement: Slurm release detected (sbatch --version); --placement-submit-as overrides the method it calls for");
                }
            }
            (Some(how), Err(e)) => {
                tracing::info!(error = %e, submit_as = ?how, "placement: Slurm release not read; submitting as --placement-submit-as says");
            }
            (None, _) => {
                if let Err(e) = self.get(slurm).await {
                    tracing::warn!(error = %e, "placement: the Slurm release is not known yet (sbatch --version); asked again before the next submission");
                }
            }
        }
    }

    /// The method to submit with now: the flag's, else the detected one (detected now if not known yet).
    pub(crate) async fn get(&self, slurm: &SlurmClient) -> Result<SubmitAs, SlurmError> {
        if let Some(how) = self.explicit {
            return Ok(how);
        }
        self.detected
            .get_or_try_init(|| async {
                let release = slurm.release().await?;
                let (how, why) = choose(release);
                tracing::info!(%release, submit_as = ?how, why, "placement: Slurm release detected (sbatch --version); submit method chosen");
                Ok(how)
            })
            .await
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::slurm::SlurmArgs;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn sbatch(dir: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("sbatch");
        // Written beside and renamed: a running script is never rewritten in place.
        let tmp = dir.join("sbatch.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }

    #[test]
    fn each_release_gets_its_method() {
        let v = |text| SlurmVersion::parse(text).unwrap();
        assert_eq!(choose(v("slurm-wlm 22.05.8")).0, SubmitAs::UidOption);
        assert_eq!(choose(v("slurm-wlm 24.11.5")).0, SubmitAs::UidOption);
        assert_eq!(choose(v("slurm 26.05.0")).0, SubmitAs::Setpriv);
        assert_eq!(choose(v("slurm 27.05.1")).0, SubmitAs::Setpriv);
    }

    #[test]
    fn detected_once_known_and_the_flag_always_wins() {
        let dir = tempfile::tempdir().unwrap();
        let slurm = SlurmClient::new(SlurmArgs {
            slurm_bin_dir: Some(dir.path().to_path_buf()),
            ..SlurmArgs::default()
        });
        let rt = rt();
        // Not known yet: slurmctld (a configless site's source of slurm.conf) is down.
        sbatch(
            dir.path(),
            "#!/bin/sh\necho 'sbatch: fatal: Could not establish a configuration source' >&2\nexit 1\n",
        );
        let auto = SubmitMethod::new(None);
        rt.block_on(auto.start(&slurm));
        assert!(rt.block_on(auto.get(&slurm)).is_err());
        // Text that is not a version line is not a release.
        sbatch(dir.path(), "#!/bin/sh\necho 'slurm 26.05.0 --uid'\n");
        assert!(matches!(
            rt.block_on(auto.get(&slurm)),
            Err(SlurmError::Unreadable { .. })
        ));
        sbatch(dir.path(), "#!/bin/sh\necho 'slurm 26.05.0'\n");
        assert_eq!(rt.block_on(auto.get(&slurm)).ok(), Some(SubmitAs::Setpriv));
        // Known: not asked again.
        sbatch(dir.path(), "#!/bin/sh\necho 'slurm-wlm 22.05.8'\n");
        assert_eq!(
            rt.block_on(auto.clone().get(&slurm)).ok(),
            Some(SubmitAs::Setpriv)
        );
        assert_eq!(
            rt.block_on(SubmitMethod::new(None).get(&slurm)).ok(),
            Some(SubmitAs::UidOption)
        );
        // The flag wins over what the release calls for, and needs no sbatch at all.
        for how in [SubmitAs::Setpriv, SubmitAs::UidOption] {
            let explicit = SubmitMethod::new(Some(how));
            rt.block_on(explicit.start(&slurm));
            assert_eq!(rt.block_on(explicit.get(&slurm)).ok(), Some(how));
        }
        let none = SlurmClient::new(SlurmArgs {
            slurm_bin_dir: Some(dir.path().join("absent")),
            ..SlurmArgs::default()
        });
        let explicit = SubmitMethod::new(Some(SubmitAs::Setpriv));
        rt.block_on(explicit.start(&none));
        assert_eq!(
            rt.block_on(explicit.get(&none)).ok(),
            Some(SubmitAs::Setpriv)
        );
    }
}
