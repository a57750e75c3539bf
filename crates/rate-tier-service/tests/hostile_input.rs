//! Hostile and malformed requests: each gets a clear error, nothing is
//! charged, and the service keeps serving.

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
    let channel = tonic::transport::Channel::from_shared(format!(
        "http://{}",
        svc.grpc()
    ))
    .expect("uri")
    .connect()
    .await
    .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec =
        tonic_prost::ProstCodec::<raw::Request, RateLimitResponse>::default();
    let path = http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(request), path, codec)
        .await
        .map(tonic::Response::into_inner)
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

    let many = svc
        .call(request(&svc.domain, (0..65).map(|_| ana()).collect()))
        .await
        .unwrap_err();
    assert_eq!(many.code(), Code::InvalidArgument);
    assert_eq!(
        many.message(),
        "the request has 65 descriptors; at most 64 are accepted"
    );

    let huge = svc
        .call(request(&svc.domain, (0..20_000).map(|_| ana()).collect()))
        .await
        .unwrap_err();
    assert_eq!(huge.code(), Code::InvalidArgument);
    assert!(
        huge.message().starts_with("the request is "),
        "{}",
        huge.message()
    );

    let long_value = "x".repeat(5000);
    let long = svc
        .call(request(
            &svc.domain,
            vec![ana(), desc(&[("user", &long_value)])],
        ))
        .await
        .unwrap_err();
    assert_eq!(long.code(), Code::InvalidArgument);
    assert_eq!(
        long.message(),
        "the value of descriptor 1, entry 0, is 5000 bytes; at most 4096 are accepted"
    );

    let entries: Vec<(String, String)> =
        (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let pairs: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let deep = svc
        .call(request(&svc.domain, vec![desc(&pairs)]))
        .await
        .unwrap_err();
    assert_eq!(deep.code(), Code::InvalidArgument);
    assert_eq!(
        deep.message(),
        "descriptor 0 has 33 entries; at most 32 are accepted"
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

    // A value that is not UTF-8.
    let not_utf8 = raw_call(
        &svc,
        raw::Request {
            domain: svc.domain.as_bytes().to_vec(),
            descriptors: vec![raw::Descriptor {
                entries: vec![raw::Entry {
                    key: b"user".to_vec(),
                    value: vec![0xff, 0xfe, b'a'],
                }],
            }],
        },
    )
    .await
    .unwrap_err();
    assert_eq!(not_utf8.code(), Code::InvalidArgument, "{not_utf8:?}");
    assert!(
        not_utf8.message().contains("UTF-8"),
        "{}",
        not_utf8.message()
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
    let big = vec![b' '; 70 * 1024];
    assert_eq!(http(svc.http(), "POST", "/json", &big).await.status, 413);
    assert_eq!(http(svc.http(), "GET", "/json", b"").await.status, 405);
    assert_eq!(svc.store.calls(), 0);
    still_serving_and_uncharged(&svc).await;
}
