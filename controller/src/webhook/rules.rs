//! The admission rules, as pure functions of the review, the [`Policy`] and what the handler looked up.
//!
//! | rule | requests | who is held to it | refused |
//! |---|---|---|---|
//! | `own-node-report` | NodeReport, NodeResourceTopology, Numatopology: CREATE, UPDATE, DELETE | the node agent's ServiceAccount | an object whose name is not the node its token is bound to; a token bound to no pod or node |
//! | `slurm-pod-node-name` | pods CREATE, pods/binding and bindings CREATE | all but administrators, the controller, a node's kubelet for its own mirror pods (and, for bindings, the schedulers) | `spec.nodeName` / a binding target that is a Slurm-managed Node (or a Node that does not exist) |
//! | `slurm-job-id` | pods CREATE, UPDATE; pods/status UPDATE; pods/binding and bindings CREATE | all but administrators and the controller | setting, changing or removing the `slurm.isthmus.io/job-id` annotation |
//! | `slurm-tolerations` | pods CREATE, UPDATE | all but administrators, the controller and a node's kubelet for its own mirror pods | a toleration of a taint isthmus sets, or one with no key and operator `Exists` ([`super::tolerations`]); on UPDATE only those added |
//! | `slurm-node-mapping` | nodes CREATE, UPDATE; nodes/status UPDATE | all but administrators | setting, changing or removing `isthmus.io/slurm-node-name`; removing or changing the Slurm-managed label or taint |
//! | `review-size` | any review longer than the webhook reads whole | whoever another rule would hold to it, but the controller for pods | everything ([`too_long`]) |
//!
//! The handler runs [`first_step`], looks up what it asks for (the requester's pod, the target Node) and finishes
//! with [`with_requester_node`] or [`with_target_node`].

use serde_json::Value;

use super::facts;
use super::requester::{self, Claim, Policy};
use super::review::Request;
use super::tolerations;

/// Annotation of the Slurm job a pod runs in (set by the controller's binding).
pub const JOB_ID: &str = crate::placement::annotations::JOB_ID;
/// Label naming a Node's Slurm node.
pub const SLURM_NODE_NAME: &str = crate::nodesync::decide::SLURM_NODE_NAME_LABEL;

/// One rule; its name is the metric label and leads every denial message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// An agent writes only its own node's reports.
    NodeReport,
    /// No pod placed on a Slurm-managed Node by naming it.
    PodNodeName,
    /// The job-id annotation is the controller's.
    JobId,
    /// No pod tolerates isthmus's taints (or every taint).
    Tolerations,
    /// A Node's Slurm identity is the administrators'.
    NodeMapping,
    /// A review longer than the webhook reads, from anyone a rule would hold to it.
    Size,
    /// No rule applies to this request.
    None,
}

impl Rule {
    /// The rule's name.
    pub fn name(self) -> &'static str {
        match self {
            Rule::NodeReport => "own-node-report",
            Rule::PodNodeName => "slurm-pod-node-name",
            Rule::JobId => "slurm-job-id",
            Rule::Tolerations => "slurm-tolerations",
            Rule::NodeMapping => "slurm-node-mapping",
            Rule::Size => "review-size",
            Rule::None => "none",
        }
    }
}

/// What a rule decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The request keeps to the rule.
    Allowed,
    /// The requester is not held to the rule.
    Exempt,
    /// Refused, with the reason.
    Denied(String),
}

impl Outcome {
    /// The metric label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Exempt => "exempt",
            Outcome::Denied(_) => "denied",
        }
    }
}

/// A decision: the rule and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The rule that decided.
    pub(crate) rule: Rule,
    /// What it decided.
    pub(crate) outcome: Outcome,
}

impl Verdict {
    pub(super) fn allowed(rule: Rule) -> Self {
        Self {
            rule,
            outcome: Outcome::Allowed,
        }
    }

    fn exempt(rule: Rule) -> Self {
        Self {
            rule,
            outcome: Outcome::Exempt,
        }
    }

    pub(super) fn denied(rule: Rule, why: String) -> Self {
        Self {
            rule,
            outcome: Outcome::Denied(why),
        }
    }

    /// The message a denial carries: the rule's name, then why.
    pub(crate) fn message(&self) -> Option<String> {
        match &self.outcome {
            Outcome::Denied(why) => Some(format!(
                "isthmus admission rule {}: {why}",
                self.rule.name()
            )),
            _ => None,
        }
    }
}

/// What a request is, for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A NodeResourceTopology or Numatopology.
    NodeReport,
    /// A pod (main resource).
    Pod,
    /// `pods/status`.
    PodStatus,
    /// `pods/binding`, or the `bindings` resource (the same Binding, posted to the namespace).
    PodBinding,
    /// A Node or `nodes/status`.
    Node,
    /// Anything else (not sent by the shipped configurations).
    Other,
}

/// Classify a request by its resource and subresource.
pub(crate) fn target(req: &Request) -> Target {
    let r = &req.resource;
    match (
        r.group.as_str(),
        r.resource.as_str(),
        req.sub_resource.as_deref().unwrap_or(""),
    ) {
        (isthmus_api::nrt::GROUP, isthmus_api::nrt::PLURAL, "")
        | (isthmus_api::numatopo::GROUP, isthmus_api::numatopo::PLURAL, "")
        | (isthmus_api::node_report::GROUP, isthmus_api::node_report::PLURAL, "") => {
            Target::NodeReport
        }
        ("", "pods", "") => Target::Pod,
        ("", "pods", "status") => Target::PodStatus,
        ("", "pods", "binding") | ("", "bindings", "") => Target::PodBinding,
        ("", "nodes", "" | "status") => Target::Node,
        _ => Target::Other,
    }
}

/// The first step of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Decided.
    Done(Verdict),
    /// The agent's token is bound to this pod (in the agent's namespace): read its node and UID, then
    /// [`with_requester_node`].
    RequesterPod {
        /// Pod name.
        name: String,
        /// The UID the token was issued for.
        uid: String,
    },
    /// The request places a pod on this Node: find out whether it is Slurm-managed, then [`with_target_node`].
    TargetNode(String),
    /// The request changes this Node: read it as stored (with the review's old `resourceVersion`), then
    /// [`with_stored_node`].
    StoredNode(String),
}

/// What the handler found out about a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeLookup {
    /// It exists and is Slurm-managed.
    Managed,
    /// It exists and is not.
    Unmanaged,
    /// There is no such Node.
    Missing,
    /// It could not be read.
    Failed(String),
}

fn job_id(obj: Option<&Value>) -> Option<&str> {
    obj.and_then(|o| facts::annotation(o, JOB_ID))
}

/// The name of the object a request writes: the new object's, else the old one's, else the request's.
fn object_name(req: &Request) -> &str {
    req.object
        .as_ref()
        .and_then(facts::name)
        .or_else(|| req.old_object.as_ref().and_then(facts::name))
        .unwrap_or(&req.name)
}

/// Decide what can be decided from the review alone.
pub(crate) fn first_step(policy: &Policy, req: &Request) -> Step {
    let user = &req.user_info;
    match target(req) {
        Target::NodeReport if policy.is_agent(user) => match requester::claim(&user.extra) {
            Ok(Claim::Node(node)) => Step::Done(report_verdict(req, &node, "its token's node")),
            Ok(Claim::Pod { name, uid }) => Step::RequesterPod { name, uid },
            Err(why) => Step::Done(Verdict::denied(
                Rule::NodeReport,
                format!(
                    "{} may write only its own node's {}, and {why}",
                    user.username,
                    kind_of(req)
                ),
            )),
        },
        Target::NodeReport | Target::Other => Step::Done(Verdict::allowed(Rule::None)),
        Target::Pod | Target::PodStatus | Target::PodBinding => pod_step(policy, req),
        Target::Node if policy.is_admin(user) => Step::Done(Verdict::exempt(Rule::NodeMapping)),
        // The Node as stored, not the review's oldObject: kube-apiserver 1.20 sends a Node PATCH's result as its
        // oldObject too (seen on the test server), which would hide every change.
        Target::Node if req.operation == "UPDATE" => Step::StoredNode(req.name.clone()),
        Target::Node => Step::Done(node_verdict(req, None)),
    }
}

fn kind_of(req: &Request) -> &'static str {
    if req.resource.resource == isthmus_api::nrt::PLURAL {
        "NodeResourceTopology"
    } else {
        "Numatopology"
    }
}

fn report_verdict(req: &Request, node: &str, whence: &str) -> Verdict {
    let name = object_name(req);
    if name == node {
        Verdict::allowed(Rule::NodeReport)
    } else {
        Verdict::denied(
            Rule::NodeReport,
            format!(
                "{} may write only the {} of its own node {node} ({whence}), not {name:?} ({})",
                req.user_info.username,
                kind_of(req),
                req.operation
            ),
        )
    }
}

/// Finish an agent's report write once the node of its token's pod is known (or why it is not).
pub(crate) fn with_requester_node(req: &Request, node: Result<String, String>) -> Verdict {
    match node {
        Ok(node) => report_verdict(req, &node, "the node of the pod its token is bound to"),
        Err(why) => Verdict::denied(
            Rule::NodeReport,
            format!(
                "{} may write only its own node's {}, and {why}",
                req.user_info.username,
                kind_of(req)
            ),
        ),
    }
}

/// The Node a pod request places the pod on: `spec.nodeName` at creation, a binding's target.
fn placed_on(req: &Request) -> Option<&str> {
    let obj = req.object.as_ref()?;
    match (target(req), req.operation.as_str()) {
        (Target::Pod, "CREATE") => facts::pod_node_name(obj),
        (Target::PodBinding, "CREATE") => facts::binding_target(obj),
        _ => None,
    }
}

fn pod_step(policy: &Policy, req: &Request) -> Step {
    let user = &req.user_info;
    let placed = placed_on(req);
    let rule = if placed.is_some() {
        Rule::PodNodeName
    } else {
        Rule::JobId
    };
    if policy.is_admin(user) || policy.is_controller(user) {
        return Step::Done(Verdict::exempt(rule));
    }
    // The job id: a binding carries it to the pod; a pod may not gain, change or lose it.
    let (new, old) = (job_id(req.object.as_ref()), job_id(req.old_object.as_ref()));
    if new != old && req.operation != "DELETE" {
        let what = match (old, new) {
            (None, Some(_)) => "set",
            (Some(_), None) => "remove",
            _ => "change",
        };
        return Step::Done(Verdict::denied(
            Rule::JobId,
            format!(
                "only the isthmus controller records a pod's Slurm job: {} may not {what} the {JOB_ID} annotation",
                user.username
            ),
        ));
    }
    // A kubelet's mirror pod on its own Node: the static pod runs whatever admission says.
    let own_mirror = |node: &str| {
        target(req) == Target::Pod
            && requester::kubelet_node(user) == Some(node)
            && req
                .object
                .as_ref()
                .and_then(|o| facts::annotation(o, facts::MIRROR_POD))
                .is_some()
    };
    if let (Target::Pod, Some(pod)) = (target(req), req.object.as_ref()) {
        let mirror = facts::pod_node_name(pod).is_some_and(own_mirror);
        let added = match req.operation.as_str() {
            "CREATE" | "UPDATE" => tolerations::first_refused(pod, req.old_object.as_ref()),
            _ => None,
        };
        if let (Some(why), false) = (added, mirror) {
            return Step::Done(Verdict::denied(
                Rule::Tolerations,
                format!(
                    "pods get Slurm-managed Nodes from Slurm's scheduler (schedulerName isthmus-slurm) and need no \
                     toleration: {} may not give a pod {why}",
                    user.username
                ),
            ));
        }
    }
    let Some(node) = placed else {
        return Step::Done(Verdict::allowed(Rule::JobId));
    };
    if own_mirror(node) || (target(req) == Target::PodBinding && policy.is_scheduler(user)) {
        return Step::Done(Verdict::exempt(Rule::PodNodeName));
    }
    Step::TargetNode(node.to_owned())
}

/// Decide a review of `length` bytes, longer than the `max` the webhook reads whole, from its head: what no rule
/// judges is allowed as ever; anyone a rule would hold to it is refused (the rule cannot be shown to hold, and an
/// object padded past the limit must not pass a webhook whose failure policy is Ignore), but administrators, and the
/// controller for pods. The API server stores no object larger than etcd's 1.5 MiB, so only JSON far larger than
/// its stored form (huge annotations of characters JSON escapes) gets here.
pub(crate) fn too_long(policy: &Policy, req: &Request, length: u64, max: usize) -> Verdict {
    let user = &req.user_info;
    let t = target(req);
    let pod = matches!(t, Target::Pod | Target::PodStatus | Target::PodBinding);
    match t {
        Target::Other => Verdict::allowed(Rule::None),
        Target::NodeReport if !policy.is_agent(user) => Verdict::allowed(Rule::None),
        _ if policy.is_admin(user) || (pod && policy.is_controller(user)) => {
            Verdict::exempt(Rule::Size)
        }
        _ => Verdict::denied(
            Rule::Size,
            format!(
                "the review is {length} bytes, more than the {max} this webhook reads: {} may not write a {} this \
                 large",
                user.username, req.resource.resource
            ),
        ),
    }
}

/// Finish a pod placed on a Node by name once it is known whether that Node is Slurm-managed.
pub(crate) fn with_target_node(req: &Request, node: &str, lookup: NodeLookup) -> Verdict {
    let who = &req.user_info.username;
    let how = if target(req) == Target::PodBinding {
        "bind a pod to"
    } else {
        "create a pod with spec.nodeName"
    };
    let why = match lookup {
        NodeLookup::Unmanaged => return Verdict::allowed(Rule::PodNodeName),
        NodeLookup::Managed => format!(
            "Node {node} is Slurm-managed: pods get it from Slurm's scheduler (schedulerName isthmus-slurm); {who} \
             may not {how} it"
        ),
        NodeLookup::Missing => {
            format!("Node {node} does not exist, so it cannot be shown not to be Slurm-managed")
        }
        NodeLookup::Failed(e) => {
            format!("Node {node} could not be read to check that it is not Slurm-managed: {e}")
        }
    };
    Verdict::denied(Rule::PodNodeName, why)
}

/// Finish a Node update once the Node as stored before it is known (or why it is not).
pub(crate) fn with_stored_node(req: &Request, stored: Result<Value, String>) -> Verdict {
    match stored {
        Ok(old) => node_verdict(req, Some(&old)),
        Err(why) => Verdict::denied(
            Rule::NodeMapping,
            format!("the Node's Slurm mapping cannot be checked: {why}; try again"),
        ),
    }
}

fn node_verdict(req: &Request, old: Option<&Value>) -> Verdict {
    let new = req.object.as_ref();
    let Some(new) = new else {
        return Verdict::allowed(Rule::NodeMapping);
    };
    let who = &req.user_info.username;
    fn mapping(o: Option<&Value>) -> Option<&str> {
        o.and_then(|o| facts::label(o, SLURM_NODE_NAME))
    }
    if mapping(Some(new)) != mapping(old) {
        return Verdict::denied(
            Rule::NodeMapping,
            format!(
                "the {SLURM_NODE_NAME} label maps a Node to its Slurm node and only administrators set it: {who} \
                 may not change it from {:?} to {:?}",
                mapping(old),
                mapping(Some(new))
            ),
        );
    }
    if let Some(old) = old {
        let label = |o: &Value| facts::label(o, facts::MANAGED).map(str::to_owned);
        let kept_label = label(old).is_none() || label(old) == label(new);
        let new_taints = facts::taints_with_key(new, facts::MANAGED);
        let kept_taints = facts::taints_with_key(old, facts::MANAGED)
            .iter()
            .all(|t| new_taints.contains(t));
        if !kept_label || !kept_taints {
            return Verdict::denied(
                Rule::NodeMapping,
                format!(
                    "the {} label and taint mark a Node as Slurm-managed and only administrators remove or change \
                     them: {who} may not",
                    facts::MANAGED
                ),
            );
        }
    }
    Verdict::allowed(Rule::NodeMapping)
}

#[cfg(test)]
mod tests;
