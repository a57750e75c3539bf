//! Every decision semantic of the service (SPEC.md, "The standalone
//! service"), over gRPC with a tonic client, as functions of the backend:
//! `grpc_memory.rs` runs them on the memory store, `grpc_redis.rs` on Redis.
//!
//! Quotas are per hour or per minute, so that nothing comes back while a
//! test runs; `duration_until_reset` is rounded up to whole seconds.

use super::*;

fn current(
    status: &envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus,
) -> (String, u32, i32) {
    let limit = status.current_limit.as_ref().expect("a current_limit");
    (limit.name.clone(), limit.requests_per_unit, limit.unit)
}

fn reset_secs(
    status: &envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus,
) -> Option<i64> {
    status.duration_until_reset.as_ref().map(|d| d.seconds)
}

const HOUR: i32 = 3;
const MINUTE: i32 = 2;

/// `limit_remaining` and `duration_until_reset` come from GCRA: 10 per hour
/// is one every 360 s.
pub async fn remaining_and_reset_from_gcra(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    rate_limit: {name: per_user, unit: hour, requests_per_unit: 10}\n",
        |_| {},
    )
    .await;
    let d = || vec![desc(&[("user", "ana")])];
    let first = svc.ask(d()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(first.statuses.len(), 1);
    let s = &first.statuses[0];
    assert_eq!(s.code, OK);
    assert_eq!(current(s), ("per_user".to_owned(), 10, HOUR));
    assert_eq!(s.limit_remaining, 9);
    assert_eq!(reset_secs(s), Some(360));
    for remaining in (0..9).rev() {
        let r = svc.ask(d()).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    let refused = svc.ask(d()).await;
    assert_eq!(refused.overall_code, OVER_LIMIT);
    assert_eq!(refused.statuses[0].code, OVER_LIMIT);
    assert_eq!(refused.statuses[0].limit_remaining, 0);
    assert_eq!(
        reset_secs(&refused.statuses[0]),
        Some(3600),
        "full again in one hour"
    );
    // Another user has a bucket of its own.
    let bea = svc.ask(vec![desc(&[("user", "bea")])]).await;
    assert_eq!(bea.statuses[0].limit_remaining, 9);
}

/// The descriptors of one request are one decision: a refusal charges
/// nothing.
pub async fn all_or_nothing(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: search\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        |_| {},
    )
    .await;
    let both = || vec![desc(&[("plan", "ana")]), desc(&[("search", "ana")])];
    let first = svc.ask(both()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        (
            first.statuses[0].limit_remaining,
            first.statuses[1].limit_remaining
        ),
        (4, 0)
    );
    let second = svc.ask(both()).await;
    assert_eq!(second.overall_code, OVER_LIMIT);
    assert_eq!(second.statuses[0].code, OK, "the plan passed on its own");
    assert_eq!(second.statuses[0].limit_remaining, 4, "and was not charged");
    assert_eq!(second.statuses[1].code, OVER_LIMIT);
    let plan = svc.ask(vec![desc(&[("plan", "ana")])]).await;
    assert_eq!(
        plan.statuses[0].limit_remaining, 3,
        "only the first request charged it"
    );
}

/// No matching rule, an unknown domain, an unknown key: OK without a
/// `current_limit`, and no store call.
pub async fn no_match_is_ok_without_limit(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    value: ana\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        |_| {},
    )
    .await;
    for descriptors in [
        vec![desc(&[("other", "x")])],
        vec![desc(&[("user", "bea")])],
        vec![desc(&[])],
    ] {
        let r = svc.ask(descriptors).await;
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(r.statuses[0].limit_remaining, 0);
        assert!(r.statuses[0].duration_until_reset.is_none());
    }
    let unknown = svc
        .call(request(
            "no-such-domain",
            vec![desc(&[("user", "ana")]), desc(&[("user", "ana")])],
        ))
        .await
        .expect("OK");
    assert_eq!(unknown.overall_code, OK);
    assert_eq!(unknown.statuses.len(), 2);
    assert!(
        unknown
            .statuses
            .iter()
            .all(|s| s.code == OK && s.current_limit.is_none())
    );
    assert_eq!(svc.store.calls(), 0, "nothing reached the store");
}

/// `unlimited`: OK, 4294967295 remaining, no store touched.
pub async fn unlimited_touches_no_store(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    value: admin\n    rate_limit: {unlimited: true}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        |_| {},
    )
    .await;
    for _ in 0..3 {
        let r = svc.ask(vec![desc(&[("user", "admin")])]).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(r.statuses[0].current_limit.is_none());
        assert!(r.statuses[0].duration_until_reset.is_none());
    }
    assert_eq!(svc.store.calls(), 0);
}

/// `requests_per_unit: 0` refuses every request, without the store; a peek
/// is OK with 0 remaining; the other descriptors are not charged.
pub async fn zero_refuses_everything(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: ip\n    value: 192.0.2.66\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
        |_| {},
    )
    .await;
    let r = svc.ask(vec![desc(&[("ip", "192.0.2.66")])]).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
    assert_eq!(current(&r.statuses[0]).1, 0);
    assert_eq!(svc.store.calls(), 0, "a limit of 0 needs no store");

    let peek = svc.ask(vec![desc_hits(&[("ip", "192.0.2.66")], 0)]).await;
    assert_eq!(peek.overall_code, OK);
    assert_eq!(peek.statuses[0].limit_remaining, 0);

    let both = svc
        .ask(vec![
            desc(&[("plan", "ana")]),
            desc(&[("ip", "192.0.2.66")]),
        ])
        .await;
    assert_eq!(both.overall_code, OVER_LIMIT);
    assert_eq!(both.statuses[0].code, OK);
    assert_eq!(both.statuses[0].limit_remaining, 5, "read, not charged");
    let plan = svc.ask(vec![desc(&[("plan", "ana")])]).await;
    assert_eq!(plan.statuses[0].limit_remaining, 4);
}

/// A `shadow_mode` rule decides and counts, and answers OK.
pub async fn shadow_rule_answers_ok(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
        |_| {},
    )
    .await;
    let d = || vec![desc(&[("user", "ana")]), desc(&[("plan", "ana")])];
    assert_eq!(svc.ask(d()).await.overall_code, OK);
    let second = svc.ask(d()).await;
    assert_eq!(second.overall_code, OK, "shadow never refuses");
    assert_eq!(second.statuses[0].code, OK);
    assert_eq!(second.statuses[0].limit_remaining, 0);
    assert!(second.statuses[0].current_limit.is_some());
    assert_eq!(
        second.statuses[1].limit_remaining, 3,
        "the enforced limit was charged"
    );
    let metrics = svc.metrics().await;
    let labels = format!("{{domain=\"{}\",rule=\"user\"}}", svc.domain);
    assert_eq!(
        metric(
            &metrics,
            &format!("ratelimit_service_rate_limit_shadow_mode_total{labels}")
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            &format!("ratelimit_service_rate_limit_over_limit_total{labels}")
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &metrics,
            &format!("ratelimit_service_rate_limit_total_hits_total{labels}")
        ),
        Some(2.0)
    );
}

/// `--shadow`: every limit in shadow: the request is OK, the statuses say
/// where a limit would have refused, and it is counted.
pub async fn global_shadow(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        |o| o.decide.shadow = true,
    )
    .await;
    let d = || vec![desc(&[("user", "ana")])];
    assert_eq!(svc.ask(d()).await.overall_code, OK);
    let second = svc.ask(d()).await;
    assert_eq!(second.overall_code, OK);
    assert_eq!(
        second.statuses[0].code, OVER_LIMIT,
        "as upstream's SHADOW_MODE"
    );
    let metrics = svc.metrics().await;
    assert_eq!(
        metric(&metrics, "ratelimit_service_global_shadow_mode_total"),
        Some(1.0)
    );
}

/// `hits_addend`: the request's (0 is 1), a descriptor's own (overrides),
/// and a descriptor's present 0: a peek.
pub async fn hits_addend(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        |_| {},
    )
    .await;
    let mut r = request(&svc.domain, vec![desc(&[("user", "ana")])]);
    r.hits_addend = 3;
    let three = svc.call(r.clone()).await.expect("OK");
    assert_eq!(three.statuses[0].limit_remaining, 7);
    r.hits_addend = 0;
    let one = svc.call(r.clone()).await.expect("OK");
    assert_eq!(one.statuses[0].limit_remaining, 6, "0 means 1");
    r.hits_addend = 5;
    r.descriptors = vec![desc_hits(&[("user", "ana")], 2)];
    let own = svc.call(r.clone()).await.expect("OK");
    assert_eq!(
        own.statuses[0].limit_remaining, 4,
        "the descriptor's own wins"
    );
    r.descriptors = vec![desc_hits(&[("user", "ana")], 0)];
    for _ in 0..3 {
        let peek = svc.call(r.clone()).await.expect("OK");
        assert_eq!(peek.overall_code, OK);
        assert_eq!(
            peek.statuses[0].limit_remaining, 4,
            "a peek charges nothing"
        );
    }
    // Spend the rest, then peek at the empty bucket: OK, 0 remaining.
    r.descriptors = vec![desc_hits(&[("user", "ana")], 4)];
    assert_eq!(
        svc.call(r.clone()).await.expect("OK").statuses[0].limit_remaining,
        0
    );
    r.descriptors = vec![desc_hits(&[("user", "ana")], 0)];
    let empty = svc.call(r.clone()).await.expect("OK");
    assert_eq!(
        (empty.overall_code, empty.statuses[0].limit_remaining),
        (OK, 0)
    );
    assert_eq!(reset_secs(&empty.statuses[0]), Some(3600));
}

/// A cost above the limit can never pass: refused, nothing charged.
pub async fn cost_above_limit(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        |_| {},
    )
    .await;
    let r = svc.ask(vec![desc_hits(&[("user", "ana")], 11)]).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let huge = svc.ask(vec![desc_hits(&[("user", "ana")], u64::MAX)]).await;
    assert_eq!(huge.overall_code, OVER_LIMIT);
    let next = svc.ask(vec![desc(&[("user", "ana")])]).await;
    assert_eq!(next.statuses[0].limit_remaining, 9, "nothing was charged");
}

/// A rule applies only when it matches the descriptor's last entry.
pub async fn rule_on_the_last_entry(backend: &Backend) {
    let svc = Svc::start(
        backend,
        concat!(
            "  - key: route\n    value: api\n    rate_limit: {name: route, unit: hour, requests_per_unit: 10}\n",
            "    descriptors:\n",
            "      - key: method\n        value: POST\n        rate_limit: {name: post, unit: hour, requests_per_unit: 5}\n",
            "      - key: tenant\n        descriptors:\n          - key: user\n            rate_limit: {name: user, unit: hour, requests_per_unit: 3}\n",
        ),
        |_| {},
    )
    .await;
    let name = |r: &RateLimitResponse| {
        r.statuses[0].current_limit.as_ref().map(|l| l.name.clone())
    };
    assert_eq!(
        name(&svc.ask(vec![desc(&[("route", "api")])]).await).as_deref(),
        Some("route")
    );
    assert_eq!(
        name(
            &svc.ask(vec![desc(&[("route", "api"), ("method", "POST")])])
                .await
        )
        .as_deref(),
        Some("post")
    );
    // Deeper than the rule: no limit, even though `route` has one.
    assert_eq!(
        name(
            &svc.ask(vec![desc(&[
                ("route", "api"),
                ("method", "POST"),
                ("x", "y")
            ])])
            .await
        ),
        None
    );
    assert_eq!(
        name(
            &svc.ask(vec![desc(&[("route", "api"), ("method", "GET")])])
                .await
        ),
        None,
        "no rule for GET: no backtracking to `route`"
    );
    // Ending on a node without a rate_limit: no limit.
    assert_eq!(
        name(
            &svc.ask(vec![desc(&[("route", "api"), ("tenant", "t1")])])
                .await
        ),
        None
    );
    assert_eq!(
        name(
            &svc.ask(vec![desc(&[
                ("route", "api"),
                ("tenant", "t1"),
                ("user", "u")
            ])])
            .await
        )
        .as_deref(),
        Some("user")
    );
}

/// Key-only and wildcard rules: one bucket per value; `share_threshold`: one
/// for all; exact beats wildcard beats key-only.
pub async fn wildcards_and_buckets(backend: &Backend) {
    let svc = Svc::start(
        backend,
        concat!(
            "  - key: path\n    rate_limit: {name: any, unit: hour, requests_per_unit: 10}\n",
            "  - key: path\n    value: /api/*\n    rate_limit: {name: api, unit: hour, requests_per_unit: 5}\n",
            "  - key: path\n    value: /api/health\n    rate_limit: {name: health, unit: hour, requests_per_unit: 3}\n",
            "  - key: path\n    value: /files/*\n    share_threshold: true\n    rate_limit: {name: files, unit: hour, requests_per_unit: 4}\n",
        ),
        |_| {},
    )
    .await;
    let ask = |path: &'static str| {
        let svc = &svc;
        async move { svc.ask(vec![desc(&[("path", path)])]).await }
    };
    let named = |r: &RateLimitResponse| {
        let s = &r.statuses[0];
        (
            s.current_limit
                .as_ref()
                .map(|l| l.name.clone())
                .unwrap_or_default(),
            s.limit_remaining,
        )
    };
    assert_eq!(named(&ask("/api/health").await), ("health".into(), 2));
    assert_eq!(named(&ask("/api/users").await), ("api".into(), 4));
    assert_eq!(
        named(&ask("/api/orders").await),
        ("api".into(), 4),
        "one bucket per value"
    );
    assert_eq!(named(&ask("/other").await), ("any".into(), 9));
    assert_eq!(
        named(&ask("/else").await),
        ("any".into(), 9),
        "key-only: per value"
    );
    assert_eq!(named(&ask("/files/a").await), ("files".into(), 3));
    assert_eq!(
        named(&ask("/files/b").await),
        ("files".into(), 2),
        "share_threshold: shared"
    );
}

/// A descriptor's own `limit` is honoured in a known domain, and ignored in
/// an unknown one (as upstream).
pub async fn limit_override(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        |_| {},
    )
    .await;
    let r = svc
        .ask(vec![desc_override(&[("user", "ana")], 2, MINUTE)])
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    let limit = r.statuses[0].current_limit.as_ref().expect("the override");
    assert_eq!((limit.requests_per_unit, limit.unit), (2, MINUTE));
    assert_eq!(reset_secs(&r.statuses[0]), Some(30));
    // With no rule for the entries at all.
    let free = svc
        .ask(vec![desc_override(&[("any", "x")], 1, MINUTE)])
        .await;
    assert_eq!(free.statuses[0].limit_remaining, 0);
    let again = svc
        .ask(vec![desc_override(&[("any", "x")], 1, MINUTE)])
        .await;
    assert_eq!(again.overall_code, OVER_LIMIT);
    // The rule's own bucket is apart.
    let rule = svc.ask(vec![desc(&[("user", "ana")])]).await;
    assert_eq!(rule.statuses[0].limit_remaining, 9);
    let unknown = svc
        .call(request(
            "unknown-domain",
            vec![desc_override(&[("any", "x")], 1, MINUTE)],
        ))
        .await
        .expect("OK");
    assert!(unknown.statuses[0].current_limit.is_none());
}

/// `replaces`: a rule named by another matched rule of the request is
/// dropped (OK, no limit, not charged).
pub async fn replaces(backend: &Backend) {
    let svc = Svc::start(
        backend,
        concat!(
            "  - key: user\n    rate_limit: {name: generic, unit: hour, requests_per_unit: 10}\n",
            "  - key: vip\n    rate_limit:\n      name: special\n      unit: hour\n      requests_per_unit: 100\n      replaces: [{name: generic}]\n",
        ),
        |_| {},
    )
    .await;
    let r = svc
        .ask(vec![desc(&[("user", "ana")]), desc(&[("vip", "ana")])])
        .await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none(), "replaced");
    assert_eq!(r.statuses[1].limit_remaining, 99);
    let alone = svc.ask(vec![desc(&[("user", "ana")])]).await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 9,
        "the replaced rule was not charged"
    );

    // Regression: an unlimited rule that is replaced stays unlimited
    // (upstream marks unlimited descriptors before it applies `replaces`),
    // rather than reporting no limit and 0 remaining.
    let svc = Svc::start(
        backend,
        concat!(
            "  - key: user\n    rate_limit: {name: generic, unlimited: true}\n",
            "  - key: vip\n    rate_limit:\n      name: special\n      unit: hour\n      requests_per_unit: 100\n      replaces: [{name: generic}]\n",
        ),
        |_| {},
    )
    .await;
    let r = svc
        .ask(vec![desc(&[("user", "ana")]), desc(&[("vip", "ana")])])
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX, "{r:?}");
    assert_eq!(r.statuses[1].limit_remaining, 99);
}

/// Two descriptors of one request in the same bucket: charged twice, in
/// one decision.
pub async fn same_bucket_twice(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        |_| {},
    )
    .await;
    let r = svc
        .ask(vec![desc(&[("user", "ana")]), desc(&[("user", "ana")])])
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining),
        (1, 1)
    );
    let over = svc
        .ask(vec![desc(&[("user", "ana")]), desc(&[("user", "ana")])])
        .await;
    assert_eq!(over.overall_code, OVER_LIMIT, "2 more do not fit in 1");
    assert_eq!(
        svc.ask(vec![desc(&[("user", "ana")])]).await.statuses[0]
            .limit_remaining,
        0
    );
}

/// `--headers both`: the `x-ratelimit-*` of the most constrained descriptor
/// and the IETF fields, in `response_headers_to_add`.
pub async fn response_headers(backend: &Backend) {
    let svc = Svc::start(
        backend,
        "  - key: a\n    rate_limit: {name: wide, unit: hour, requests_per_unit: 10}\n  - key: b\n    rate_limit: {name: narrow, unit: hour, requests_per_unit: 2}\n",
        |o| o.decide.headers = tower_rate_tier::headers::HeaderStyle::Both,
    )
    .await;
    let r = svc
        .ask(vec![desc(&[("a", "1")]), desc(&[("b", "1")])])
        .await;
    let header = |name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(header("x-ratelimit-limit").as_deref(), Some("2"));
    assert_eq!(header("x-ratelimit-remaining").as_deref(), Some("1"));
    assert!(header("x-ratelimit-reset").is_some());
    assert_eq!(
        header("ratelimit-policy").as_deref(),
        Some("\"wide\";q=10;w=3600, \"narrow\";q=2;w=3600")
    );
    assert_eq!(
        header("ratelimit").as_deref(),
        Some("\"wide\";r=9;t=360, \"narrow\";r=1;t=1800")
    );
    svc.ask(vec![desc(&[("b", "1")])]).await;
    let refused = svc
        .ask(vec![desc(&[("a", "1")]), desc(&[("b", "1")])])
        .await;
    assert!(
        refused
            .response_headers_to_add
            .iter()
            .any(|h| h.key == "retry-after" && h.value == "1800"),
        "{:?}",
        refused.response_headers_to_add
    );
}

/// Everything above, one after the other (for a backend whose tests run in
/// one function).
pub async fn every_semantic(backend: &Backend) {
    remaining_and_reset_from_gcra(backend).await;
    all_or_nothing(backend).await;
    no_match_is_ok_without_limit(backend).await;
    unlimited_touches_no_store(backend).await;
    zero_refuses_everything(backend).await;
    shadow_rule_answers_ok(backend).await;
    global_shadow(backend).await;
    hits_addend(backend).await;
    cost_above_limit(backend).await;
    rule_on_the_last_entry(backend).await;
    wildcards_and_buckets(backend).await;
    limit_override(backend).await;
    replaces(backend).await;
    same_bucket_twice(backend).await;
    response_headers(backend).await;
}
