//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it: a candidate claims
//! the Lease when it is free or when the record it read has not changed for the record's lease duration (measured on
//! this replica's clock, never by comparing timestamps written by others); the holder renews it every retry period;
//! every claim and renewal is conditional on the `resourceVersion` read (a merge patch that carries it: 409 when
//! another replica wrote first). Each call has a timeout; [`Elector::try_acquire_or_renew`] says whether this replica
//! holds the Lease now, and the caller records successes in its [`super::fence::Fence`].

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

/// Why a claim or renewal gave no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaseError {
    /// The API server did not answer in time.
    #[error("{what}: no answer within {after:?}")]
    Timeout {
        /// The request.
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// The API server refused or failed the request.
    #[error("{what}: {source}")]
    Api {
        /// The request.
        what: &'static str,
        /// The client's error.
        source: kube::Error,
    },
}

/// What the Lease record says, as far as the election compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// `holderIdentity` (empty: released).
    pub(crate) holder: String,
    /// `leaseDurationSeconds`.
    pub(crate) duration_seconds: i32,
    /// `renewTime`, as written.
    pub(crate) renew_time: Option<String>,
    /// `acquireTime`, as written.
    pub(crate) acquire_time: Option<String>,
    /// `leaseTransitions`.
    pub(crate) transitions: i32,
}

impl Record {
    fn from_spec(spec: Option<&LeaseSpec>) -> Record {
        let time = |t: &Option<MicroTime>| {
            t.as_ref()
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.as_str().map(str::to_owned))
        };
        Record {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default(),
            duration_seconds: spec.and_then(|s| s.lease_duration_seconds).unwrap_or(0),
            renew_time: spec.and_then(|s| time(&s.renew_time)),
            acquire_time: spec.and_then(|s| time(&s.acquire_time)),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        }
    }
}

/// What to do with a Lease record read at `now`. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Write our claim: a renewal (same acquire time and transitions) or a takeover (new acquire time, one more
    /// transition).
    Write {
        /// Whether this renews our own claim.
        renew: bool,
        /// `leaseTransitions` to write.
        transitions: i32,
    },
    /// Another replica holds it and its record changed less than its duration ago.
    HeldBy(String),
}

/// The claim for `record`, observed unchanged since `observed_at`, by `me` at `now`.
pub(crate) fn claim(record: &Record, observed_at: Instant, me: &str, now: Instant) -> Claim {
    if record.holder == me {
        return Claim::Write {
            renew: true,
            transitions: record.transitions,
        };
    }
    let duration = Duration::from_secs(u64::try_from(record.duration_seconds.max(1)).unwrap_or(1));
    if !record.holder.is_empty() && now < observed_at + duration {
        return Claim::HeldBy(record.holder.clone());
    }
    Claim::Write {
        renew: false,
        transitions: record.transitions.saturating_add(1),
    }
}

/// Settings of one election.
#[derive(Debug, Clone)]
pub(crate) struct LeaseConfig {
    /// Lease name.
    pub(crate) name: String,
    /// Its namespace.
    pub(crate) namespace: String,
    /// This replica's identity.
    pub(crate) identity: String,
    /// `leaseDurationSeconds` of our claims.
    pub(crate) duration: Duration,
    /// Longest time one request may take.
    pub(crate) call_timeout: Duration,
    /// Field manager of our writes.
    pub(crate) field_manager: String,
}

/// One replica's view of the election.
#[derive(Debug)]
pub(crate) struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The last record read and when it was first seen (local clock).
    observed: Option<(Record, Instant)>,
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Elector {
    /// An elector for `config` through `client`.
    pub(crate) fn new(client: kube::Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    async fn call<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(self.config.call_timeout, f).await {
            Err(_) => Err(LeaseError::Timeout {
                what,
                after: self.config.call_timeout,
            }),
            Ok(r) => r.map_err(|source| LeaseError::Api { what, source }),
        }
    }

    /// Read the Lease and claim or renew it when [`claim`] says so: `Ok(true)` when this replica holds it now,
    /// `Ok(false)` when another does (or won a race for it).
    pub(crate) async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaseError> {
        let me = self.config.identity.clone();
        let seconds = i32::try_from(self.config.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let current = self
            .call("reading the Lease", self.api.get_opt(&self.config.name))
            .await?;
        let Some(lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now_micro()),
                    renew_time: Some(now_micro()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            let pp = PostParams {
                field_manager: Some(self.config.field_manager.clone()),
                ..PostParams::default()
            };
            return match self
                .call("creating the Lease", self.api.create(&pp, &lease))
                .await
            {
                Ok(_) => Ok(true),
                Err(LeaseError::Api {
                    source: kube::Error::Api(s),
                    ..
                }) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let record = Record::from_spec(lease.spec.as_ref());
        let now = Instant::now();
        let observed_at = match &self.observed {
            Some((r, at)) if *r == record => *at,
            _ => {
                self.observed = Some((record.clone(), now));
                now
            }
        };
        let (renew, transitions) = match claim(&record, observed_at, &me, now) {
            Claim::HeldBy(_) => return Ok(false),
            Claim::Write { renew, transitions } => (renew, transitions),
        };
        let stamp = serde_json::to_value(now_micro()).unwrap_or(serde_json::Value::Null);
        let acquire = match (&record.acquire_time, renew) {
            (Some(t), true) => serde_json::Value::String(t.clone()),
            _ => stamp.clone(),
        };
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {
                "holderIdentity": me,
                "leaseDurationSeconds": seconds,
                "acquireTime": acquire,
                "renewTime": stamp,
                "leaseTransitions": transitions,
            },
        });
        let pp = PatchParams {
            field_manager: Some(self.config.field_manager.clone()),
            ..PatchParams::default()
        };
        match self
            .call(
                if renew {
                    "renewing the Lease"
                } else {
                    "claiming the Lease"
                },
                self.api
                    .patch(&self.config.name, &pp, &Patch::Merge(&patch)),
            )
            .await
        {
            Ok(_) => Ok(true),
            // Another replica wrote first: read again next time.
            Err(LeaseError::Api {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Give the Lease up (holder cleared, duration 1 s) if this replica still holds it, so that a standby takes
    /// over at once.
    pub(crate) async fn release(&mut self) -> Result<(), LeaseError> {
        let current = self
            .call("reading the Lease", self.api.get_opt(&self.config.name))
            .await?;
        let Some(lease) = current else { return Ok(()) };
        if Record::from_spec(lease.spec.as_ref()).holder != self.config.identity {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {"holderIdentity": null, "leaseDurationSeconds": 1, "renewTime": now_micro()},
        });
        let pp = PatchParams {
            field_manager: Some(self.config.field_manager.clone()),
            ..PatchParams::default()
        };
        self.call(
            "releasing the Lease",
            self.api
                .patch(&self.config.name, &pp, &Patch::Merge(&patch)),
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, transitions: i32) -> Record {
        Record {
            holder: holder.into(),
            duration_seconds: 15,
            renew_time: Some("2026-01-01T00:00:00.000000Z".into()),
            acquire_time: Some("2026-01-01T00:00:00.000000Z".into()),
            transitions,
        }
    }

    #[test]
    fn our_own_claim_is_renewed() {
        let t0 = Instant::now();
        assert_eq!(
            claim(&record("a", 3), t0, "a", t0 + Duration::from_secs(60)),
            Claim::Write {
                renew: true,
                transitions: 3
            }
        );
    }

    #[test]
    fn another_holder_is_waited_out_on_our_own_clock() {
        let t0 = Instant::now();
        let r = record("b", 3);
        assert_eq!(
            claim(&r, t0, "a", t0 + Duration::from_secs(14)),
            Claim::HeldBy("b".into())
        );
        assert_eq!(
            claim(&r, t0, "a", t0 + Duration::from_secs(15)),
            Claim::Write {
                renew: false,
                transitions: 4
            }
        );
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let t0 = Instant::now();
        assert_eq!(
            claim(&record("", 7), t0, "a", t0),
            Claim::Write {
                renew: false,
                transitions: 8
            }
        );
    }

    #[test]
    fn records_compare_what_a_renewal_changes() {
        let mut spec = LeaseSpec {
            holder_identity: Some("b".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
            )),
            ..LeaseSpec::default()
        };
        let a = Record::from_spec(Some(&spec));
        assert_eq!(a.holder, "b");
        assert!(
            a.renew_time
                .as_deref()
                .is_some_and(|t| t.starts_with("2023-11-14T22:13:20"))
        );
        spec.renew_time = Some(MicroTime(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_002).unwrap(),
        ));
        assert_ne!(a, Record::from_spec(Some(&spec)), "a renewal is a change");
        assert_eq!(Record::from_spec(None).holder, "");
    }
}
