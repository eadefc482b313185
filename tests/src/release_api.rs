//! The API server of a Slurm test: 22.05's tests share one ([`ApiServer::shared`]); another release's test gets its
//! own, so that the Node and namespace names of one release's test never meet another's running at the same time.

use crate::apiserver::ApiServer;
use crate::slurm_release::SlurmRelease;

/// The shared server (22.05) or one of the test's own.
#[derive(Debug)]
pub enum ReleaseApi {
    /// The process-wide server of the 22.05 tests.
    Shared(&'static ApiServer),
    /// A server started for this test alone, stopped when dropped.
    Own(Box<ApiServer>),
}

impl std::ops::Deref for ReleaseApi {
    type Target = ApiServer;
    fn deref(&self) -> &ApiServer {
        match self {
            ReleaseApi::Shared(a) => a,
            ReleaseApi::Own(a) => a,
        }
    }
}

/// The API server for a test of `release`.
pub fn api_for(release: SlurmRelease) -> ReleaseApi {
    if release == SlurmRelease::V22_05 {
        ReleaseApi::Shared(ApiServer::shared())
    } else {
        ReleaseApi::Own(Box::new(ApiServer::start()))
    }
}
