//! A request beyond the bounds (more than 256 descriptors, or more than
//! 1 MiB) is read no further than the bound and refused with one
//! `OVER_LIMIT` status, on gRPC and on `/json` alike: never an error, never
//! a status per descriptor, never memory in proportion to what was sent.
//!
//! A counting allocator measures each call (client and server are in this
//! process): the peak of live bytes above the start of the call. The tests
//! of this file run one at a time, so that one's allocations are not
//! counted in another's.
// The counting allocator wraps `System`: the one unsafe code of the tests.
#![allow(unsafe_code)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::Message;
use support::*;

/// The system allocator, counting live bytes and their peak.
struct Counted;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call goes to `System` with the caller's arguments; the
// counters are only arithmetic beside it.
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(
        &self,
        ptr: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // While it moves, both blocks are live.
            grew(new_size);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counted = Counted;

/// One test at a time (see the module docs).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> =
    tokio::sync::Mutex::const_new(());

const MIB: usize = 1024 * 1024;

/// `call`'s output, the peak of bytes it held above the start, and its time.
async fn measured<T>(
    call: impl Future<Output = T>,
) -> (T, usize, std::time::Duration) {
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let started = Instant::now();
    let out = call.await;
    let took = started.elapsed();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(start);
    (out, peak, took)
}

const RULE: &str =
    "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

/// An empty message: a descriptor of no entry on the wire (2 bytes), held
/// in no memory by the client.
#[derive(Clone, PartialEq, prost::Message)]
struct Nothing {}

/// `RateLimitRequest` with descriptors of no entry.
#[derive(Clone, PartialEq, prost::Message)]
struct EmptyDescriptors {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<Nothing>,
}

/// As many empty descriptors as make a message of about `bytes`.
fn empty_descriptors(domain: &str, bytes: usize) -> EmptyDescriptors {
    let message = EmptyDescriptors {
        domain: domain.to_owned(),
        descriptors: vec![Nothing {}; bytes / 2],
    };
    assert!(message.encoded_len().abs_diff(bytes) < 64);
    message
}

/// One refusal, whatever was sent: `OVER_LIMIT` with one status.
fn one_refusal(response: &RateLimitResponse, what: &str) {
    assert_eq!(response.overall_code, OVER_LIMIT, "{what}: {response:?}");
    assert_eq!(
        response.statuses.len(),
        1,
        "{what}: one status, not one per descriptor ({} bytes of answer)",
        response.encoded_len()
    );
    assert_eq!(response.statuses[0].code, OVER_LIMIT, "{what}");
    assert!(response.encoded_len() < 64, "{what}: {response:?}");
}

/// `ana` was never charged, and the store never asked.
async fn nothing_charged(svc: &Svc) {
    assert_eq!(
        svc.store.calls(),
        0,
        "an oversized request reached the store"
    );
    let r = svc.ask(vec![desc(&[("user", "ana")])]).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
}

fn oversized_calls(metrics: &str, transport: &str) -> f64 {
    metric(
        metrics,
        &format!(
            "ratelimit_service_should_rate_limit_total{{transport=\"{transport}\",code=\"oversized\"}}"
        ),
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_beyond_a_bound_is_one_refusal_read_no_further_than_the_bound() {
    let _one = ONE_AT_A_TIME.lock().await;
    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;

    // 257 descriptors, each one a limit with room.
    let many = request(
        &svc.domain,
        (0..257).map(|_| desc(&[("user", "ana")])).collect(),
    );
    let r = svc.call(many).await.expect("refused, never an error");
    one_refusal(&r, "257 descriptors");

    // One descriptor, a message over 1 MiB.
    let value = "v".repeat(MIB);
    let r = svc
        .call(request(&svc.domain, vec![desc(&[("user", &value)])]))
        .await
        .expect("refused, never an error");
    one_refusal(&r, "a message over 1 MiB");

    // 4 MiB of empty descriptors (two million): refused without decoding
    // them. The client's and the server's buffers of the message are the
    // only large blocks.
    let message = empty_descriptors(&svc.domain, 4 * MIB);
    let (r, peak, took) = measured(raw_call(svc.grpc(), message)).await;
    let r = r.expect("refused, never an error");
    println!("4 MiB of empty descriptors: {peak} bytes at peak, {took:?}");
    one_refusal(&r, "4 MiB of empty descriptors");
    assert!(peak < 24 * MIB, "{peak} bytes held for a 4 MiB message");

    // Under 1 MiB, but half a million descriptors: counted as they are
    // read, never decoded past the 257th.
    let message = empty_descriptors(&svc.domain, MIB - 64);
    let (r, peak, took) = measured(raw_call(svc.grpc(), message)).await;
    let r = r.expect("refused, never an error");
    println!("1 MiB of empty descriptors: {peak} bytes at peak, {took:?}");
    one_refusal(&r, "1 MiB of empty descriptors");
    assert!(peak < 8 * MIB, "{peak} bytes held for a 1 MiB message");

    assert_eq!(oversized_calls(&svc.metrics().await, "grpc"), 4.0);
    nothing_charged(&svc).await;
}

/// `/json`'s answer, read as the `RateLimitResponse` it stands for: the
/// overall code and the code of each status.
fn json_answer(body: &str) -> RateLimitResponse {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
    let value: serde_json::Value =
        serde_json::from_str(body).expect("a JSON answer");
    let code = |v: &serde_json::Value| match v.as_str() {
        Some("OK") => OK,
        Some("OVER_LIMIT") => OVER_LIMIT,
        _ => 0,
    };
    RateLimitResponse {
        overall_code: code(&value["overallCode"]),
        statuses: value["statuses"]
            .as_array()
            .map(|statuses| {
                statuses
                    .iter()
                    .map(|s| DescriptorStatus {
                        code: code(&s["code"]),
                        ..DescriptorStatus::default()
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ..RateLimitResponse::default()
    }
}

/// A `/json` body of `count` descriptors, each `descriptor`.
fn json_body(domain: &str, descriptor: &str, count: usize) -> Vec<u8> {
    let mut body = format!(r#"{{"domain":"{domain}","descriptors":["#);
    for i in 0..count {
        if i > 0 {
            body.push(',');
        }
        body.push_str(descriptor);
    }
    body.push_str("]}");
    body.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_beyond_a_bound_is_one_refusal_read_no_further_than_the_bound() {
    let _one = ONE_AT_A_TIME.lock().await;
    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;
    let ana = r#"{"entries":[{"key":"user","value":"ana"}]}"#;
    let cases = [
        ("257 descriptors", json_body(&svc.domain, ana, 257), MIB),
        (
            "a body over 1 MiB",
            json_body(&svc.domain, &ana.replace("ana", &"v".repeat(MIB)), 1),
            8 * MIB,
        ),
        (
            "4 MiB of empty descriptors",
            json_body(&svc.domain, "{}", 4 * MIB / 3),
            24 * MIB,
        ),
        (
            "1 MiB of empty descriptors",
            json_body(&svc.domain, "{}", (MIB - 64) / 3),
            8 * MIB,
        ),
    ];
    for (what, body, most) in &cases {
        let (r, peak, took) =
            measured(http(svc.http(), "POST", "/json", body)).await;
        println!(
            "{what}: {} bytes, {peak} bytes at peak, {took:?}",
            body.len()
        );
        assert_eq!(r.status, 429, "{what}: {}", r.body.len());
        one_refusal(&json_answer(&r.body), what);
        assert!(
            r.body.len() < 100,
            "{what}: {} bytes of answer",
            r.body.len()
        );
        assert!(peak < *most, "{what}: {peak} bytes held");
    }
    assert_eq!(oversized_calls(&svc.metrics().await, "json"), 4.0);
    nothing_charged(&svc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_lets_an_oversized_request_through_and_says_so() {
    let _one = ONE_AT_A_TIME.lock().await;
    let svc = Svc::start(&Backend::Memory, RULE, |options| {
        options.decide.shadow = true;
    })
    .await;
    let many = request(
        &svc.domain,
        (0..257).map(|_| desc(&[("user", "ana")])).collect(),
    );
    let r = svc.call(many).await.expect("never an error");
    // `--shadow` refuses nothing; the one status says what was decided.
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
    let body = json_body(&svc.domain, "{}", 300);
    let r = http(svc.http(), "POST", "/json", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = json_answer(&r.body);
    assert_eq!(answer.overall_code, OK);
    assert_eq!(answer.statuses.len(), 1);
    assert_eq!(answer.statuses[0].code, OVER_LIMIT);
    let metrics = svc.metrics().await;
    assert_eq!(oversized_calls(&metrics, "grpc"), 1.0);
    assert_eq!(oversized_calls(&metrics, "json"), 1.0);
}
