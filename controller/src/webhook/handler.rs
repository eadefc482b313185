//! One AdmissionReview in, one out: parse, decide with [`rules`], looking up on the way what a rule needs (the pod
//! an agent's token is bound to, the Node a pod is placed on), count and log. Every lookup has a timeout shorter
//! than the webhook configurations' `timeoutSeconds`; a lookup that fails denies (the rule cannot be shown to hold).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::GetParams;
use kube::{Api, Client};

use super::facts;
use super::head::Head;
use super::requester::{Policy, node_of_pod};
use super::review::{self, Request, ReviewOut};
use super::rules::{self, NodeLookup, Step, Verdict};

/// Longest wait for one API read while a review is open (the configurations give the webhook 5 s in all).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Pods whose node is remembered (a pod's node and UID never change; a token of a deleted pod no longer
/// authenticates). Past this many, the memory starts over.
const POD_CACHE: usize = 16_384;

/// The webhook's decisions, with what they need to look things up.
pub(crate) struct Handler {
    client: Client,
    policy: Policy,
    /// (pod name, UID) → node, for the agent's pods.
    pods: Mutex<HashMap<(String, String), String>>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The review's old `resourceVersion`.
fn old_version(req: &Request) -> Option<&str> {
    req.old_object
        .as_ref()
        .and_then(|o| o.get("metadata")?.get("resourceVersion")?.as_str())
}

fn count(rule: &'static str, result: &'static str) {
    metrics::counter!("isthmus_controller_admission_requests_total", "rule" => rule, "result" => result)
        .increment(1);
}

impl Handler {
    /// A handler reading through `client`.
    pub(crate) fn new(client: Client, policy: Policy) -> Self {
        Self {
            client,
            policy,
            pods: Mutex::new(HashMap::new()),
        }
    }

    /// A body that is not an AdmissionReview this webhook answers: counted, logged, and the message for the
    /// HTTP 400 that says so.
    pub(crate) fn invalid(&self, why: &str) -> String {
        count(rules::Rule::None.name(), "invalid");
        tracing::warn!(error = %why, "webhook: a request that is not an AdmissionReview");
        why.to_owned()
    }

    /// The answer to a review no rule judges, from its head alone (its objects never decoded); `None` when a rule
    /// does.
    pub(crate) fn without_objects(&self, req: &Request) -> Option<Result<Vec<u8>, String>> {
        (rules::target(req) == rules::Target::Other)
            .then(|| self.answer(req, Verdict::allowed(rules::Rule::None)))
    }

    /// The answer to a review of `length` bytes, longer than the `max` read whole, from its head
    /// ([`rules::too_long`]).
    pub(crate) fn long(&self, head: Head, length: u64, max: usize) -> Result<Vec<u8>, String> {
        let req = head.check().map_err(|e| self.invalid(&e.to_string()))?;
        let verdict = rules::too_long(&self.policy, &req, length, max);
        self.answer(&req, verdict)
    }

    /// Answer one review body: the AdmissionReview JSON, or why the body is not one (HTTP 400).
    pub(crate) async fn review(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        let req = review::parse(body).map_err(|e| self.invalid(&e.to_string()))?;
        let verdict = self.decide(&req).await;
        self.answer(&req, verdict)
    }

    /// Count, log a denial, and write the answer.
    fn answer(&self, req: &Request, verdict: Verdict) -> Result<Vec<u8>, String> {
        count(verdict.rule.name(), verdict.outcome.label());
        let out = match verdict.message() {
            Some(message) => {
                tracing::info!(
                    user = %req.user_info.username,
                    operation = %req.operation,
                    resource = %req.resource.resource,
                    subresource = req.sub_resource.as_deref().unwrap_or(""),
                    namespace = req.namespace.as_deref().unwrap_or(""),
                    name = %req.name,
                    rule = verdict.rule.name(),
                    %message,
                    "admission denied"
                );
                ReviewOut::deny(&req.uid, message)
            }
            None => ReviewOut::allow(&req.uid),
        };
        serde_json::to_vec(&out).map_err(|e| e.to_string())
    }

    async fn decide(&self, req: &Request) -> Verdict {
        match rules::first_step(&self.policy, req) {
            Step::Done(v) => v,
            Step::RequesterPod { name, uid } => {
                let node = self.node_of_agent_pod(&name, &uid).await;
                rules::with_requester_node(req, node)
            }
            Step::TargetNode(node) => {
                let lookup = self.lookup_node(&node).await;
                rules::with_target_node(req, &node, lookup)
            }
            Step::StoredNode(node) => {
                let stored = self.stored_node(&node, old_version(req)).await;
                rules::with_stored_node(req, stored)
            }
        }
    }

    async fn node_of_agent_pod(&self, name: &str, uid: &str) -> Result<String, String> {
        let key = (name.to_owned(), uid.to_owned());
        if let Some(node) = self
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(node.clone());
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.policy.agent_namespace);
        let pod = match tokio::time::timeout(LOOKUP_TIMEOUT, pods.get_opt(name)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(format!("its pod {name} could not be read: {e}")),
            Err(_) => {
                return Err(format!(
                    "its pod {name} could not be read within {LOOKUP_TIMEOUT:?}"
                ));
            }
        };
        let facts = pod.as_ref().map(|p| {
            (
                p.metadata.uid.as_deref().unwrap_or(""),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .filter(|n| !n.is_empty()),
            )
        });
        let node = node_of_pod(name, uid, facts)?;
        let mut cache = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= POD_CACHE {
            cache.clear();
        }
        cache.insert(key, node.clone());
        Ok(node)
    }

    /// The Node as stored at `version` (the review's old resourceVersion), read from the API server's cache when it
    /// has that version; a Node changed meanwhile is an error (the client retries its write).
    async fn stored_node(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<serde_json::Value, String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let params = version.map_or_else(GetParams::default, GetParams::at);
        let node = match tokio::time::timeout(LOOKUP_TIMEOUT, nodes.get_with(name, &params)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(format!("Node {name} could not be read: {e}")),
            Err(_) => {
                return Err(format!(
                    "Node {name} could not be read within {LOOKUP_TIMEOUT:?}"
                ));
            }
        };
        let stored = node.metadata.resource_version.as_deref();
        if let Some(v) = version.filter(|v| Some(*v) != stored) {
            return Err(format!(
                "Node {name} changed while this write was checked (resourceVersion {v}, now {})",
                stored.unwrap_or("?")
            ));
        }
        serde_json::to_value(&node).map_err(|e| e.to_string())
    }

    async fn lookup_node(&self, name: &str) -> NodeLookup {
        let nodes: Api<Node> = Api::all(self.client.clone());
        match tokio::time::timeout(LOOKUP_TIMEOUT, nodes.get_opt(name)).await {
            Ok(Ok(Some(node))) => match serde_json::to_value(&node) {
                Ok(v) if facts::is_slurm_managed(&v) => NodeLookup::Managed,
                Ok(_) => NodeLookup::Unmanaged,
                Err(e) => NodeLookup::Failed(e.to_string()),
            },
            Ok(Ok(None)) => NodeLookup::Missing,
            Ok(Err(e)) => NodeLookup::Failed(e.to_string()),
            Err(_) => NodeLookup::Failed(format!("no answer within {LOOKUP_TIMEOUT:?}")),
        }
    }
}
