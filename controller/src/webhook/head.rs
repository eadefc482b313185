//! The bounded pre-parse of a review, before (or instead of) decoding its objects: its head — `apiVersion`, `kind`
//! and the request's uid, resource, subresource, names, operation and user — read without building the objects
//! (they are skipped, never allocated), and what decoding the whole body would cost ([`decode_cost`]), from one
//! scan of its bytes. With the head alone the webhook answers a request no rule judges, and a review longer than it
//! reads whole ([`from_prefix`]: the API server writes the request's fields in its Go struct's order, the objects
//! last, so the head is in the first kilobytes).

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::review::{API_VERSION, Request, ReviewError};

/// What a decoded JSON value costs beyond its bytes in the body (its `serde_json::Value`, the map entry or vector
/// slot holding it, the allocation of a string), measured on reviews of pods and Nodes; [`decode_cost`] counts one
/// per value.
pub(crate) const VALUE_COST: usize = 96;

/// The error that ends a prefix parse once the head has been read.
const STOP: &str = "isthmus: head read";

/// A review's head, as [`Request`] with no objects.
#[derive(Debug, Default)]
pub(crate) struct Head {
    /// `apiVersion`.
    pub(crate) api_version: String,
    /// `kind`.
    pub(crate) kind: String,
    /// The request without `object` and `oldObject`; `None` when the review has no `request`.
    pub(crate) request: Option<Request>,
}

impl Head {
    /// The request, when the review is an `admission.k8s.io/v1` AdmissionReview with one.
    pub(crate) fn check(self) -> Result<Request, ReviewError> {
        if self.api_version != API_VERSION || self.kind != "AdmissionReview" {
            return Err(ReviewError::Version {
                api_version: self.api_version,
                kind: self.kind,
            });
        }
        self.request.ok_or(ReviewError::NoRequest)
    }
}

struct ReviewSeed<'h> {
    head: &'h mut Head,
    stop: bool,
}

struct RequestSeed<'h> {
    request: &'h mut Request,
    stop: bool,
}

impl<'de> DeserializeSeed<'de> for ReviewSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ReviewSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionReview")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => self.head.api_version = map.next_value()?,
                "kind" => self.head.kind = map.next_value()?,
                "request" => {
                    let request = self.head.request.insert(empty_request());
                    map.next_value_seed(RequestSeed {
                        request,
                        stop: self.stop,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

fn empty_request() -> Request {
    Request {
        uid: String::new(),
        resource: Default::default(),
        sub_resource: None,
        name: String::new(),
        namespace: None,
        operation: String::new(),
        user_info: Default::default(),
        object: None,
        old_object: None,
    }
}

impl<'de> DeserializeSeed<'de> for RequestSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RequestSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionRequest")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let r = self.request;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "uid" => r.uid = map.next_value()?,
                "resource" => r.resource = map.next_value()?,
                "subResource" => r.sub_resource = map.next_value()?,
                "name" => r.name = map.next_value::<Option<String>>()?.unwrap_or_default(),
                "namespace" => r.namespace = map.next_value()?,
                "operation" => r.operation = map.next_value()?,
                "userInfo" => r.user_info = map.next_value()?,
                "object" | "oldObject" if self.stop => return Err(de::Error::custom(STOP)),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// The head of a whole review body (its objects skipped, not decoded).
pub(crate) fn parse(body: &[u8]) -> Result<Head, serde_json::Error> {
    let mut head = Head::default();
    let mut de = serde_json::Deserializer::from_slice(body);
    ReviewSeed {
        head: &mut head,
        stop: false,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(head)
}

/// The head from the first bytes of a review too long to read whole: read up to the request's first object.
/// `None` when the prefix ends before that, or is not the start of an AdmissionReview.
pub(crate) fn from_prefix(prefix: &[u8]) -> Option<Head> {
    let mut head = Head::default();
    let mut de = serde_json::Deserializer::from_slice(prefix);
    match (ReviewSeed {
        head: &mut head,
        stop: true,
    })
    .deserialize(&mut de)
    {
        Err(e) if e.to_string().starts_with(STOP) => {}
        _ => return None,
    }
    let uid = head.request.as_ref().is_some_and(|r| !r.uid.is_empty());
    (uid && !head.api_version.is_empty() && !head.kind.is_empty()).then_some(head)
}

/// What decoding `body` into `serde_json::Value`s costs, in bytes: its length, and [`VALUE_COST`] for each value
/// and key (counted by the structural characters outside strings: one per `{`, `[`, `,` and `:`). One pass, no
/// allocation; an upper bound for what the rules decode.
pub(crate) fn decode_cost(body: &[u8]) -> usize {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' | b'[' | b',' | b':' => values += 1,
                _ => {}
            }
        }
    }
    body.len().saturating_add(values.saturating_mul(VALUE_COST))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REVIEW: &str = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{
        "uid":"u1","kind":{"group":"","version":"v1","kind":"Pod"},
        "resource":{"group":"","version":"v1","resource":"pods"},
        "requestKind":{"group":"","version":"v1","kind":"Pod"},"name":"p","namespace":"team-b",
        "operation":"CREATE","userInfo":{"username":"alice","groups":["g"],"extra":{"k":["v"]}},
        "object":{"metadata":{"name":"p","annotations":{"a":"x\"y"}},"spec":{"containers":[{"name":"c"}]}},
        "oldObject":null,"dryRun":false,"options":{"kind":"CreateOptions"}}}"#;

    #[test]
    fn the_head_is_read_without_the_objects() {
        let head = parse(REVIEW.as_bytes()).unwrap();
        let r = head.check().unwrap();
        assert_eq!(
            (r.uid.as_str(), r.resource.resource.as_str()),
            ("u1", "pods")
        );
        assert_eq!(
            (
                r.name.as_str(),
                r.namespace.as_deref(),
                r.operation.as_str()
            ),
            ("p", Some("team-b"), "CREATE")
        );
        assert_eq!(r.user_info.username, "alice");
        assert!(r.object.is_none() && r.old_object.is_none() && r.sub_resource.is_none());
        // The full decode agrees.
        let full = super::super::review::parse(REVIEW.as_bytes()).unwrap();
        assert_eq!(
            (full.uid, full.resource, full.user_info),
            (r.uid, r.resource, r.user_info)
        );
    }

    #[test]
    fn a_prefix_gives_the_head_when_it_reaches_the_first_object() {
        let at = REVIEW.find("\"object\"").unwrap_or_default();
        for cut in [at + 12, at + 40, REVIEW.len()] {
            let head = from_prefix(&REVIEW.as_bytes()[..cut]).unwrap_or_else(|| panic!("{cut}"));
            let r = head.check().unwrap();
            assert_eq!(
                (r.uid.as_str(), r.user_info.username.as_str()),
                ("u1", "alice")
            );
        }
        for cut in [0, 10, REVIEW.find("\"userInfo\"").unwrap_or_default() + 20] {
            assert!(from_prefix(&REVIEW.as_bytes()[..cut]).is_none(), "{cut}");
        }
        assert!(from_prefix(b"\xff\xfe garbage").is_none());
        // A review whose objects come before its uid gives no head from a prefix.
        let reordered = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"object":{},"uid":"u"}}"#;
        assert!(from_prefix(reordered.as_bytes()).is_none());
    }

    #[test]
    fn other_versions_and_garbage_are_refused() {
        let v1beta1 = REVIEW.replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1");
        let head = parse(v1beta1.as_bytes()).unwrap();
        assert!(matches!(head.check(), Err(ReviewError::Version { .. })));
        let none =
            parse(br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#).unwrap();
        assert!(matches!(none.check(), Err(ReviewError::NoRequest)));
        for bad in [&b"\xff{"[..], b"[]", b"{\"request\":5}", b"{} x"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_decode_cost_counts_values_outside_strings() {
        assert_eq!(decode_cost(b"1"), 1 + VALUE_COST);
        assert_eq!(decode_cost(b"[0,0,0]"), 7 + 4 * VALUE_COST);
        // Structural characters and escaped quotes inside strings do not count.
        let s = br#"{"a":"{[,:\",]"}"#;
        assert_eq!(decode_cost(s), s.len() + 3 * VALUE_COST);
        // A body of tiny values costs many times its length; text costs about its length.
        let zeros = vec![b'0'; 1000]
            .iter()
            .flat_map(|z| [*z, b','])
            .collect::<Vec<u8>>();
        assert!(decode_cost(&zeros) > 40 * zeros.len());
        let text = format!("{{\"a\":\"{}\"}}", "x".repeat(10_000));
        assert!(decode_cost(text.as_bytes()) < text.len() + 4 * VALUE_COST);
    }

    proptest::proptest! {
        /// Any bytes, and any prefix of a real review with any bytes after it: no panic, and a cost at least the
        /// length.
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
            cut in 0usize..800,
        ) {
            let _ = parse(&bytes);
            let _ = from_prefix(&bytes);
            proptest::prop_assert!(decode_cost(&bytes) >= bytes.len());
            let mut mixed = REVIEW.as_bytes()[..cut.min(REVIEW.len())].to_vec();
            mixed.extend_from_slice(&bytes);
            let _ = parse(&mixed);
            if let Some(head) = from_prefix(&mixed) {
                proptest::prop_assert!(head.request.is_some_and(|r| !r.uid.is_empty()));
            }
        }
    }
}
