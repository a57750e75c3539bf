//! Every semantic of the service over gRPC (a tonic client from the same
//! protos, real sockets), on the memory store; plus the health service,
//! `/json`, `/healthcheck` and `/metrics`.

#[macro_use]
mod support;

use support::*;

every_semantic!(Backend::Memory);

const RULE: &str = "  - key: user\n    rate_limit: {name: per_user, unit: hour, requests_per_unit: 2}\n";

#[tokio::test]
async fn grpc_health_serves_and_stops_serving_on_shutdown() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;
    let channel = tonic::transport::Channel::from_shared(format!(
        "http://{}",
        svc.grpc()
    ))
    .expect("uri")
    .connect()
    .await
    .expect("connect");
    let mut health = HealthClient::new(channel);
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("known service")
            .into_inner()
            .status;
        assert_eq!(status, 1, "{service:?} is SERVING");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert_eq!(
        http(svc.http(), "GET", "/healthcheck", b"").await.status,
        200
    );

    svc.running.shutdown().await;
    assert_eq!(
        health
            .check(HealthCheckRequest {
                service: "ratelimit".into()
            })
            .await
            .map(|r| r.into_inner().status)
            .unwrap_or(2),
        2,
        "NOT_SERVING once the shutdown began"
    );
}

#[tokio::test]
async fn json_endpoint_answers_proto3_json() {
    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;
    let body = format!(
        r#"{{"domain":"{}","descriptors":[{{"entries":[{{"key":"user","value":"ana"}}]}}]}}"#,
        svc.domain
    );
    let ok = http(svc.http(), "POST", "/json", body.as_bytes()).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert!(
        ok.headers
            .to_ascii_lowercase()
            .contains("content-type: application/json")
    );
    let json: serde_json::Value = serde_json::from_str(&ok.body).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({
            "overallCode": "OK",
            "statuses": [{
                "code": "OK",
                "currentLimit": {"name": "per_user", "requestsPerUnit": 2, "unit": "HOUR"},
                "limitRemaining": 1,
                "durationUntilReset": "1800s"
            }]
        })
    );
    // snake_case names, a number as a string, and the enum by name.
    let body = format!(
        r#"{{"domain":"{}","hits_addend":"1","descriptors":[{{"entries":[{{"key":"user","value":"ana"}}],"hitsAddend":"1"}},
            {{"entries":[{{"key":"other","value":"x"}}],"limit":{{"requestsPerUnit":5,"unit":"MINUTE"}}}}]}}"#,
        svc.domain
    );
    let last = http(svc.http(), "POST", "/json", body.as_bytes()).await;
    assert_eq!(last.status, 200, "{last:?}");
    let over = http(svc.http(), "POST", "/json", body.as_bytes()).await;
    assert_eq!(over.status, 429, "{over:?}");
    let json: serde_json::Value =
        serde_json::from_str(&over.body).expect("JSON");
    assert_eq!(json["overallCode"], "OVER_LIMIT");
    assert_eq!(json["statuses"][0]["code"], "OVER_LIMIT");
    assert!(
        json["statuses"][0].get("limitRemaining").is_none(),
        "0 is left out"
    );
    assert_eq!(json["statuses"][1]["code"], "OK");
    assert_eq!(json["statuses"][1]["currentLimit"]["unit"], "MINUTE");
}

#[tokio::test]
async fn metrics_count_per_rule_and_store_latency() {
    let svc = Svc::start(&Backend::Memory, RULE, |_| {}).await;
    for _ in 0..3 {
        svc.ask(vec![desc(&[("user", "ana")])]).await;
    }
    let metrics = svc.metrics().await;
    let labels = format!("{{domain=\"{}\",rule=\"user\"}}", svc.domain);
    let get = |name: &str| {
        metric(
            &metrics,
            &format!("ratelimit_service_rate_limit_{name}_total{labels}"),
        )
    };
    assert_eq!(get("total_hits"), Some(3.0), "{metrics}");
    assert_eq!(get("within_limit"), Some(2.0));
    assert_eq!(get("over_limit"), Some(1.0));
    assert_eq!(
        get("near_limit"),
        Some(1.0),
        "the second hit of 2 is above 80 % (1)"
    );
    assert_eq!(get("shadow_mode"), Some(0.0));
    assert!(metrics.contains(
        "ratelimit_service_store_latency_seconds_count{store=\"memory\"} 3"
    ));
    assert!(metrics.contains("ratelimit_service_should_rate_limit_total{transport=\"grpc\",code=\"ok\"} 2"));
    assert!(metrics.contains("ratelimit_service_should_rate_limit_total{transport=\"grpc\",code=\"over_limit\"} 1"));
    assert!(
        metrics.contains(
            "ratelimit_service_config_load_total{result=\"success\"} 1"
        )
    );
    assert!(!metrics.contains("ana"), "no request value in the metrics");
}
