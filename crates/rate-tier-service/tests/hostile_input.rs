//! Hostile and malformed requests. What a gateway's client controls (the
//! values of descriptors, how long they are, whether they are UTF-8) never
//! turns a limit off: the request is decided, or refused. What only a
//! broken gateway sends (no domain, no descriptors, an unknown unit, a body
//! that is not JSON) gets a clear error, nothing is charged, and the
//! service keeps serving.

mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use support::*;
use tonic::Code;

const RULE: &str =
    "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

/// The same messages as the protos, with `bytes` where they have strings:
/// what a client that does not check UTF-8 can send.
mod raw {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Entry {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub(crate) value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Descriptor {
        #[prost(message, repeated, tag = "1")]
        pub(crate) entries: Vec<Entry>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Request {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) domain: Vec<u8>,
        #[prost(message, repeated, tag = "2")]
        pub(crate) descriptors: Vec<Descriptor>,
    }
}

async fn raw_call(
    svc: &Svc,
    request: raw::Request,
) -> Result<RateLimitResponse, tonic::Status> {
    support::raw_call(svc.grpc(), request).await
}

/// The service still decides, and `ana` was never charged.
async fn still_serving_and_uncharged(svc: &Svc) {
    let r = svc.ask(vec![desc(&[("user", "ana")])]).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 4,
        "nothing was charged before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_errors_are_invalid_argument_and_charge_nothing() {
    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;
    let ana = || desc(&[("user", "ana")]);

    let empty_domain = svc.call(request("", vec![ana()])).await.unwrap_err();
    assert_eq!(empty_domain.code(), Code::InvalidArgument);
    assert_eq!(
        empty_domain.message(),
        "rate limit domain must not be empty"
    );

    let none = svc.call(request(&svc.domain, vec![])).await.unwrap_err();
    assert_eq!(none.code(), Code::InvalidArgument);
    assert_eq!(
        none.message(),
        "rate limit descriptor list must not be empty"
    );

    let bad_unit = svc
        .call(request(
            &svc.domain,
            vec![ana(), desc_override(&[("user", "ana")], 1, 0)],
        ))
        .await
        .unwrap_err();
    assert_eq!(bad_unit.code(), Code::InvalidArgument);
    assert!(
        bad_unit.message().contains("override's unit 0"),
        "{}",
        bad_unit.message()
    );

    // The raw client works when the bytes are UTF-8 (the test is sound).
    let fine = raw_call(
        &svc,
        raw::Request {
            domain: svc.domain.as_bytes().to_vec(),
            descriptors: vec![raw::Descriptor {
                entries: vec![raw::Entry {
                    key: b"user".to_vec(),
                    value: b"bea".to_vec(),
                }],
            }],
        },
    )
    .await
    .expect("a decision");
    assert_eq!(fine.statuses[0].limit_remaining, 4);

    assert_eq!(
        svc.store.calls(),
        1,
        "only the good raw request reached the store"
    );
    still_serving_and_uncharged(&svc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_errors_are_400_and_charge_nothing() {
    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;
    let d = &svc.domain;
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"".to_vec(), 400, "Bad Request: EOF while parsing"),
        (b"not json".to_vec(), 400, "Bad Request: expected"),
        (
            format!(r#"{{"domain":"{d}","descriptors":[],"extra":1}}"#).into_bytes(),
            400,
            "Bad Request: unknown field `extra`",
        ),
        (
            format!(r#"{{"domain":"{d}","descriptors":[{{"entries":[{{"key":"user","value":"ana","x":1}}]}}]}}"#)
                .into_bytes(),
            400,
            "Bad Request: unknown field `x`",
        ),
        (
            format!(r#"{{"domain":"{d}","hitsAddend":1,"hits_addend":2,"descriptors":[]}}"#).into_bytes(),
            400,
            "Bad Request: duplicate field",
        ),
        (
            br#"{"domain":"","descriptors":[{"entries":[{"key":"user","value":"ana"}]}]}"#.to_vec(),
            400,
            "Bad Request: rate limit domain must not be empty",
        ),
        (
            format!(r#"{{"domain":"{d}","descriptors":[]}}"#).into_bytes(),
            400,
            "Bad Request: rate limit descriptor list must not be empty",
        ),
        (
            format!(r#"{{"domain":"{d}","descriptors":[{{"entries":[{{"key":"user","value":"a\ud800"}}]}}]}}"#)
                .into_bytes(),
            400,
            "Bad Request: ",
        ),
        (
            {
                let mut body = format!(r#"{{"domain":"{d}","descriptors":[{{"entries":[{{"key":"user","value":""#)
                    .into_bytes();
                body.extend([0xff, 0xfe]);
                body.extend(br#""}]}]}"#);
                body
            },
            400,
            "Bad Request: ",
        ),
        (
            format!(r#"{{"domain":"{d}","descriptors":[{{"entries":[{{"key":"user","value":"ana"}}],"hitsAddend":-1}}]}}"#)
                .into_bytes(),
            400,
            "Bad Request: -1 is out of range",
        ),
    ];
    for (body, status, start) in cases {
        let r = http(svc.http(), "POST", "/json", &body).await;
        assert_eq!(
            r.status,
            status,
            "{:?}: {r:?}",
            String::from_utf8_lossy(&body)
        );
        assert!(
            r.body.starts_with(start),
            "{:?}: {:?}",
            String::from_utf8_lossy(&body),
            r.body
        );
    }
    assert_eq!(http(svc.http(), "GET", "/json", b"").await.status, 405);
    assert_eq!(svc.store.calls(), 0);
    still_serving_and_uncharged(&svc).await;
}

/// Regression: a descriptor value over 4096 bytes (or a 65th descriptor, or
/// a value that is not UTF-8) must not make the whole call an error: nothing
/// would be charged, the request's other descriptors included, and behind
/// Envoy with `failure_mode_deny: false` the request would pass unlimited.
/// Values are hashed into keys whatever their length or bytes, and a
/// request beyond a bound is refused, never an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_input_a_gateways_client_controls_turns_a_limit_off() {
    const RULES: &str = "  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";
    let svc = Svc::start(&Backend::Memory, RULES, |_| {}).await;
    let long_path = format!("/{}", "a".repeat(4096));
    let mut left = Vec::new();
    for _ in 0..6 {
        let r = svc
            .call(request(
                &svc.domain,
                vec![
                    desc(&[("remote_address", "203.0.113.7")]),
                    desc(&[("path", &long_path)]),
                ],
            ))
            .await
            .expect("decided, never an error");
        left.push((r.overall_code, r.statuses[0].limit_remaining));
    }
    let ok = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::Ok as i32;
    let over = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit as i32;
    assert_eq!(
        left,
        [(ok, 4), (ok, 3), (ok, 2), (ok, 1), (ok, 0), (over, 0)],
        "a 4097-byte path bypassed the address limit"
    );

    // Values of 100 KiB, and values that are not UTF-8: buckets like any
    // other, distinct bytes distinct buckets.
    let huge = "h".repeat(100 * 1024);
    let r = svc
        .call(request(
            &svc.domain,
            vec![desc(&[("remote_address", &huge)])],
        ))
        .await
        .expect("decided");
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (ok, 4));
    let raw_address = |value: Vec<u8>| raw::Request {
        domain: svc.domain.as_bytes().to_vec(),
        descriptors: vec![raw::Descriptor {
            entries: vec![raw::Entry {
                key: b"remote_address".to_vec(),
                value,
            }],
        }],
    };
    for _ in 0..5 {
        let r = raw_call(&svc, raw_address(vec![0xff, 0xfe, b'a']))
            .await
            .expect("a value that is not UTF-8 is decided");
        assert_eq!(r.overall_code, ok);
    }
    let sixth = raw_call(&svc, raw_address(vec![0xff, 0xfe, b'a']))
        .await
        .unwrap();
    assert_eq!(sixth.overall_code, over, "its bucket is limited");
    let other = raw_call(&svc, raw_address(vec![0xfe, 0xff, b'a']))
        .await
        .unwrap();
    assert_eq!(
        (other.overall_code, other.statuses[0].limit_remaining),
        (ok, 4),
        "other bytes, another bucket"
    );

    // Beyond the bounds: refused, never an error. 300 descriptors (more
    // than 256), and a message over 1 MiB.
    let many = svc
        .call(request(
            &svc.domain,
            (0..300)
                .map(|i| desc(&[("path", &format!("/p{i}"))]))
                .collect(),
        ))
        .await
        .expect("refused, not an error");
    assert_eq!(many.overall_code, over);
    assert_eq!(
        many.statuses.len(),
        1,
        "one refusal, not one per descriptor"
    );
    assert_eq!(many.statuses[0].code, over);
    let megabytes = "m".repeat(1024 * 1024 + 1);
    let oversized = svc
        .call(request(&svc.domain, vec![desc(&[("path", &megabytes)])]))
        .await
        .expect("refused, not an error");
    assert_eq!(oversized.overall_code, over);

    // The same on /json: 429, never 400 or 413.
    let d = &svc.domain;
    let body = format!(
        r#"{{"domain":"{d}","descriptors":[{{"entries":[{{"key":"path","value":"{megabytes}"}}]}}]}}"#
    );
    let r = http(svc.http(), "POST", "/json", body.as_bytes()).await;
    assert_eq!(r.status, 429, "{r:?}");
    let long = format!(
        r#"{{"domain":"{d}","descriptors":[{{"entries":[{{"key":"remote_address","value":"{}"}}]}}]}}"#,
        "j".repeat(5000)
    );
    let r = http(svc.http(), "POST", "/json", long.as_bytes()).await;
    assert_eq!(r.status, 200, "{r:?}");
}
