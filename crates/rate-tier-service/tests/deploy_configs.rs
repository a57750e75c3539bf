//! The deployment files agree with the service: the Dockerfile
//! (repository root), Envoy's config (`examples/envoy/envoy.yaml`) and the
//! Kubernetes manifests (`examples/k8s/`).
//!
//! The ports are the service's defaults ([`DEFAULT_GRPC_ADDR`],
//! [`DEFAULT_HTTP_ADDR`]); the command lines (the Dockerfile's `CMD`, the
//! Deployment's `args`) go through the service's own parser
//! ([`cli::parse`]); the rules (the image's and the ConfigMap's) are loaded
//! with [`Config`], and the descriptors Envoy's route sends are decided
//! against them. The health path, `/healthcheck`, is private to the HTTP
//! router: it is compared with what `--help` ([`cli::usage`]) states.
//!
//! The YAML is read with saphyr-parser (the service's own YAML parser):
//! every scalar is a string, so ports are compared as text.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rate_tier_service::cli::{self, Command, DEFAULT_DEBUG_ADDR};
use rate_tier_service::envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use rate_tier_service::envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use rate_tier_service::envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rate_tier_service::server::{DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR};
use rate_tier_service::{Config, DecideOptions, Decider, Metrics, StoreChoice};
use rate_tier_storage::MemoryStorage;
use saphyr_parser::{Event, Parser};
use serde_json::Value;
use support::TempDir;

/// The health path the service states in `--help`.
const HEALTHCHECK: &str = "/healthcheck";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path))
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn default_port(addr: &str) -> u16 {
    addr.parse::<SocketAddr>()
        .expect("a default address")
        .port()
}

fn grpc_port() -> u16 {
    default_port(DEFAULT_GRPC_ADDR)
}

fn http_port() -> u16 {
    default_port(DEFAULT_HTTP_ADDR)
}

/// The documents of a YAML stream, as JSON values with string scalars.
fn yaml(text: &str) -> Vec<Value> {
    let mut events = Parser::new_from_str(text)
        .map(|event| event.unwrap_or_else(|e| panic!("YAML: {e:?}")).0);
    let mut documents = Vec::new();
    while let Some(event) = events.next() {
        if let Event::DocumentStart(_) = event {
            let first = events.next().expect("a document's node");
            if !matches!(first, Event::DocumentEnd) {
                documents.push(node(first, &mut events));
            }
        }
    }
    documents
}

fn node<'a>(
    event: Event<'a>,
    events: &mut impl Iterator<Item = Event<'a>>,
) -> Value {
    match event {
        Event::Scalar(text, ..) => Value::String(text.into_owned()),
        Event::SequenceStart(..) => {
            let mut items = Vec::new();
            loop {
                match events.next().expect("a list's end") {
                    Event::SequenceEnd => break Value::Array(items),
                    event => items.push(node(event, events)),
                }
            }
        }
        Event::MappingStart(..) => {
            let mut map = serde_json::Map::new();
            loop {
                match events.next().expect("a map's end") {
                    Event::MappingEnd => break Value::Object(map),
                    event => {
                        let Value::String(key) = node(event, events) else {
                            panic!("a map key that is not a scalar");
                        };
                        let next = events.next().expect("a value");
                        map.insert(key, node(next, events));
                    }
                }
            }
        }
        other => panic!(
            "unexpected YAML event {other:?} (anchors are not used here)"
        ),
    }
}

fn text<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no text at {pointer} in {value}"))
}

fn array<'v>(value: &'v Value, pointer: &str) -> &'v [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("no list at {pointer} in {value}"))
}

/// A command line and an environment through the service's own parser:
/// what it would serve.
fn serve(
    args: &[String],
    env: &[(String, String)],
) -> rate_tier_service::cli::Serve {
    let lookup = |name: &str| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    };
    match cli::parse_with_env(args, lookup) {
        Ok(Command::Serve(serve)) => *serve,
        other => panic!("{args:?} {env:?} does not serve: {other:?}"),
    }
}

/// It serves the default ports on every interface (the defaults are
/// loopback, unreachable from outside a container), the debug listener
/// included; the config it reads.
fn assert_listens_on_the_defaults(
    args: &[String],
    env: &[(String, String)],
) -> rate_tier_service::cli::Serve {
    let serve = serve(args, env);
    let (grpc, http) = (serve.options.grpc_addr, serve.options.http_addr);
    let debug = serve.options.debug_addr.expect("the debug listener");
    assert_eq!(grpc.port(), grpc_port(), "{args:?} {env:?}");
    assert_eq!(http.port(), http_port(), "{args:?} {env:?}");
    assert_eq!(debug.port(), DEFAULT_DEBUG_ADDR.port(), "{args:?} {env:?}");
    for (what, addr) in [("gRPC", grpc), ("HTTP", http), ("debug", debug)] {
        assert!(
            addr.ip().is_unspecified(),
            "{args:?} {env:?}: {what} on every interface"
        );
    }
    serve
}

// --- the Dockerfile -------------------------------------------------------

/// The instructions of the Dockerfile's last stage, continuations joined.
fn runtime_stage() -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in read("Dockerfile").lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        let (part, continued) = match line.strip_suffix('\\') {
            Some(part) => (part.trim_end(), true),
            None => (line, false),
        };
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(part);
        if !continued {
            lines.push(std::mem::take(&mut current));
        }
    }
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM");
    lines.split_off(start)
}

fn instruction(stage: &[String], keyword: &str) -> String {
    let prefix = format!("{keyword} ");
    stage
        .iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("the runtime stage has no {keyword}"))
        .to_owned()
}

/// The image's environment: its `ENV KEY=VALUE ...` instructions.
fn image_env(stage: &[String]) -> Vec<(String, String)> {
    stage
        .iter()
        .filter_map(|l| l.strip_prefix("ENV "))
        .flat_map(str::split_whitespace)
        .map(|pair| {
            let (key, value) = pair.split_once('=').expect("ENV KEY=VALUE");
            (key.to_owned(), value.trim_matches('"').to_owned())
        })
        .collect()
}

/// The image's command line: its `CMD`, if any.
fn image_args(stage: &[String]) -> Vec<String> {
    stage
        .iter()
        .find_map(|l| l.strip_prefix("CMD "))
        .map(|cmd| serde_json::from_str(cmd).expect("CMD in JSON form"))
        .unwrap_or_default()
}

/// Where the image's rules are: the config its command line and its
/// environment name, where the Dockerfile copies examples/ratelimit.
fn image_config_dir() -> String {
    let stage = runtime_stage();
    let serve =
        assert_listens_on_the_defaults(&image_args(&stage), &image_env(&stage));
    let config = serve.options.config_path;
    config.to_str().expect("UTF-8").to_owned()
}

#[test]
fn the_dockerfile_serves_the_default_ports_and_checks_the_health_path() {
    let stage = runtime_stage();
    let expose = instruction(&stage, "EXPOSE");
    for port in [grpc_port(), http_port(), DEFAULT_DEBUG_ADDR.port()] {
        assert!(
            expose.split_whitespace().any(|p| p == port.to_string()),
            "EXPOSE {expose} lacks {port}"
        );
    }
    // The rules the image holds are where CMD's --config reads them.
    let config = image_config_dir();
    let copy = instruction(&stage, "COPY examples/ratelimit/");
    assert_eq!(copy.trim_end_matches('/'), config);
    // A non-root, numeric user (the Kubernetes example runs as the same).
    let user = instruction(&stage, "USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric USER");
    assert_ne!(uid, 0);
    // The health check asks the service's health path on its HTTP port.
    assert!(
        cli::usage().contains(HEALTHCHECK),
        "--help names {HEALTHCHECK}"
    );
    let health = instruction(&stage, "HEALTHCHECK");
    assert!(
        health.contains(&format!("/dev/tcp/127.0.0.1/{}", http_port())),
        "{health}"
    );
    assert!(
        health.contains(&format!("GET {HEALTHCHECK} HTTP/1.1")),
        "{health}"
    );
    let entrypoint: Vec<String> =
        serde_json::from_str(&instruction(&stage, "ENTRYPOINT")).expect("JSON");
    assert_eq!(entrypoint, ["/usr/local/bin/rate-tier-service"]);
}

// --- Envoy ------------------------------------------------------------------

fn envoy() -> Value {
    let mut documents = yaml(&read("examples/envoy/envoy.yaml"));
    assert_eq!(documents.len(), 1);
    documents.remove(0)
}

/// The HTTP connection manager of Envoy's (one) listener.
fn envoy_hcm(envoy: &Value) -> &Value {
    let listeners = array(envoy, "/static_resources/listeners");
    assert_eq!(listeners.len(), 1);
    let filters = array(&listeners[0], "/filter_chains/0/filters");
    let hcm = &filters[0];
    assert_eq!(
        text(hcm, "/name"),
        "envoy.filters.network.http_connection_manager"
    );
    &hcm["typed_config"]
}

fn envoy_ratelimit_filter(envoy: &Value) -> &Value {
    let filters = array(envoy_hcm(envoy), "/http_filters");
    let names: Vec<&str> = filters.iter().map(|f| text(f, "/name")).collect();
    // Before the router, which would otherwise answer first.
    assert_eq!(
        names,
        ["envoy.filters.http.ratelimit", "envoy.filters.http.router"]
    );
    &filters[0]["typed_config"]
}

#[test]
fn envoy_asks_the_grpc_port_over_http2() {
    let envoy = envoy();
    let filter = envoy_ratelimit_filter(&envoy);
    assert_eq!(
        text(filter, "/@type"),
        "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
    );
    assert_eq!(
        text(filter, "/rate_limit_service/transport_api_version"),
        "V3"
    );
    let name = text(
        filter,
        "/rate_limit_service/grpc_service/envoy_grpc/cluster_name",
    );
    let cluster = array(&envoy, "/static_resources/clusters")
        .iter()
        .find(|c| text(c, "/name") == name)
        .unwrap_or_else(|| panic!("no cluster {name}"));
    // gRPC is HTTP/2.
    let options = &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert!(
        options
            .pointer("/explicit_http_config/http2_protocol_options")
            .is_some(),
        "{cluster}"
    );
    let address = &cluster
        .pointer("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
        .expect("an endpoint");
    assert_eq!(text(address, "/port_value"), grpc_port().to_string());
    // The Kubernetes Service's name: the same config works in the cluster.
    let service = &yaml(&read("examples/k8s/service.yaml"))[0];
    assert_eq!(text(address, "/address"), text(service, "/metadata/name"));
}

/// The descriptors Envoy's route sends for a request from `client` with
/// `headers`: one per `rate_limits` entry whose actions all apply (the
/// actions this example uses; another one fails the test, to be added here).
fn envoy_descriptors(
    envoy: &Value,
    client: &str,
    headers: &[(&str, &str)],
) -> Vec<RateLimitDescriptor> {
    let hcm = envoy_hcm(envoy);
    let route = &array(hcm, "/route_config/virtual_hosts/0/routes")[0];
    let mut descriptors = Vec::new();
    for rate_limit in array(route, "/route/rate_limits") {
        let entries: Option<Vec<Entry>> = array(rate_limit, "/actions")
            .iter()
            .map(|action| {
                let (kind, body) = action
                    .as_object()
                    .and_then(|a| a.iter().next())
                    .expect("an action");
                match kind.as_str() {
                    "remote_address" => Some(Entry {
                        key: "remote_address".into(),
                        value: client.into(),
                    }),
                    "request_headers" => {
                        let header = text(body, "/header_name");
                        headers.iter().find(|(h, _)| *h == header).map(
                            |(_, v)| Entry {
                                key: text(body, "/descriptor_key").into(),
                                value: (*v).into(),
                            },
                        )
                    }
                    "generic_key" => Some(Entry {
                        key: body
                            .get("descriptor_key")
                            .and_then(Value::as_str)
                            .unwrap_or("generic_key")
                            .into(),
                        value: text(body, "/descriptor_value").into(),
                    }),
                    other => {
                        panic!("an action this test does not model: {other}")
                    }
                }
            })
            .collect();
        if let Some(entries) = entries {
            descriptors.push(RateLimitDescriptor {
                entries,
                ..Default::default()
            });
        }
    }
    descriptors
}

/// Decides `request` against `config` `times` times; the names of the
/// limits of the last answer and its overall code.
async fn decide(
    config: Config,
    request: &RateLimitRequest,
    times: usize,
) -> (i32, Vec<String>) {
    let decider = Decider::new(
        config,
        Arc::new(MemoryStorage::new()),
        DecideOptions::default(),
        Arc::new(Metrics::new(None)),
    );
    let mut last = None;
    for _ in 0..times {
        last = Some(decider.decide(request, "test").await.expect("a decision"));
    }
    let last = last.expect("at least one decision");
    let names = last
        .statuses
        .iter()
        .map(|s| {
            s.current_limit
                .as_ref()
                .map(|l| l.name.clone())
                .unwrap_or_default()
        })
        .collect();
    (last.overall_code, names)
}

/// The rules Envoy's descriptors meet: the image's and the ConfigMap's.
fn rule_sets() -> Vec<(&'static str, Config)> {
    let image = Config::load(repo().join("examples/ratelimit"))
        .expect("the image's rules");
    vec![
        ("the image's rules", image),
        ("the ConfigMap's rules", configmap_rules()),
    ]
}

#[tokio::test]
async fn envoys_descriptors_meet_the_rules() {
    const OK: i32 = 1;
    const OVER_LIMIT: i32 = 2;
    let envoy = envoy();
    let domain = text(envoy_ratelimit_filter(&envoy), "/domain").to_owned();
    for (which, config) in rule_sets() {
        assert!(
            config.domains().any(|d| d == domain),
            "{which}: no domain {domain}"
        );
    }
    // A client with a free tier's key: its address and its key are limited.
    let keyed = RateLimitRequest {
        domain: domain.clone(),
        descriptors: envoy_descriptors(
            &envoy,
            "10.0.0.1",
            &[("x-plan", "free"), ("x-api-key", "key_ana")],
        ),
        hits_addend: 0,
    };
    assert_eq!(keyed.descriptors.len(), 2, "{keyed:?}");
    for (which, config) in rule_sets() {
        assert_eq!(
            decide(config, &keyed, 1).await,
            (OK, vec!["per_address".to_owned(), "free_plan".to_owned()]),
            "{which}"
        );
    }
    // The free tier's 10 per minute, then refused.
    for (which, config) in rule_sets() {
        assert_eq!(decide(config, &keyed, 11).await.0, OVER_LIMIT, "{which}");
    }
    // Without the headers only the address is sent, and limited.
    let anonymous = RateLimitRequest {
        domain: domain.clone(),
        descriptors: envoy_descriptors(&envoy, "10.0.0.2", &[]),
        hits_addend: 0,
    };
    for (which, config) in rule_sets() {
        assert_eq!(
            decide(config, &anonymous, 1).await,
            (OK, vec!["per_address".to_owned()]),
            "{which}"
        );
    }
}

// --- Kubernetes -------------------------------------------------------------

fn k8s(file: &str) -> Value {
    let mut documents = k8s_documents(file);
    assert_eq!(documents.len(), 1, "{file}");
    documents.remove(0)
}

fn k8s_documents(file: &str) -> Vec<Value> {
    yaml(&read(&format!("examples/k8s/{file}")))
}

/// The container's environment: the image's, then the pod's over it.
fn container_env(container: &Value) -> Vec<(String, String)> {
    let mut env = image_env(&runtime_stage());
    for var in array(container, "/env") {
        let (name, value) = (text(var, "/name"), text(var, "/value"));
        env.retain(|(k, _)| k != name);
        env.push((name.to_owned(), value.to_owned()));
    }
    env
}

fn configmap_rules() -> Config {
    let configmap = k8s("configmap.yaml");
    assert_eq!(text(&configmap, "/kind"), "ConfigMap");
    let data = configmap["data"].as_object().expect("data");
    let sources: Vec<(&str, &str)> = data
        .iter()
        .map(|(name, text)| (name.as_str(), text.as_str().expect("a file")))
        .collect();
    let config = Config::from_sources(sources)
        .unwrap_or_else(|e| panic!("the ConfigMap's rules: {e}"));
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    config
}

fn container(deployment: &Value) -> &Value {
    let containers = array(deployment, "/spec/template/spec/containers");
    assert_eq!(containers.len(), 1);
    &containers[0]
}

/// The number of the container port named `name`.
fn container_port(container: &Value, name: &str) -> String {
    array(container, "/ports")
        .iter()
        .find(|p| text(p, "/name") == name)
        .map(|p| text(p, "/containerPort").to_owned())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

#[test]
fn the_deployment_serves_the_defaults_with_the_configmap_as_its_rules() {
    let deployment = k8s("deployment.yaml");
    assert_eq!(text(&deployment, "/kind"), "Deployment");
    let container = container(&deployment);
    // envoyproxy/ratelimit's way: the environment alone, no arguments.
    assert!(container.get("args").is_none(), "no args: the environment");
    let serve = assert_listens_on_the_defaults(&[], &container_env(container));
    let config = serve.options.config_path;
    assert_eq!(container_port(container, "grpc"), grpc_port().to_string());
    assert_eq!(container_port(container, "http"), http_port().to_string());
    assert_eq!(
        container_port(container, "debug"),
        DEFAULT_DEBUG_ADDR.port().to_string()
    );

    // The config is the ConfigMap's volume.
    let mount = array(container, "/volumeMounts")
        .iter()
        .find(|m| Path::new(text(m, "/mountPath")) == config)
        .unwrap_or_else(|| {
            panic!("nothing mounted at the config {}", config.display())
        });
    let volume = array(&deployment, "/spec/template/spec/volumes")
        .iter()
        .find(|v| text(v, "/name") == text(mount, "/name"))
        .expect("the mount's volume");
    assert_eq!(
        text(volume, "/configMap/name"),
        text(&k8s("configmap.yaml"), "/metadata/name")
    );

    // Both probes ask the health path on the HTTP port.
    assert!(
        cli::usage().contains(HEALTHCHECK),
        "--help names {HEALTHCHECK}"
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(text(get, "/path"), HEALTHCHECK, "{probe}");
        assert_eq!(
            container_port(container, text(get, "/port")),
            http_port().to_string(),
            "{probe}"
        );
    }

    // Not root: the Dockerfile's user.
    let security = &deployment["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(text(security, "/runAsNonRoot"), "true");
    let user = instruction(&runtime_stage(), "USER");
    assert_eq!(
        text(security, "/runAsUser"),
        user.split(':').next().unwrap()
    );
}

#[test]
fn the_replicas_share_their_limits_through_the_manifests_redis() {
    let deployment = k8s("deployment.yaml");
    let replicas: u32 = text(&deployment, "/spec/replicas")
        .parse()
        .expect("a number");
    assert!(replicas > 1, "the example shows several replicas");
    let serve = serve(&[], &container_env(container(&deployment)));
    let StoreChoice::Redis(url) = &serve.options.store else {
        panic!("a shared store: {:?}", serve.options.store);
    };
    let redis = k8s_documents("redis.yaml");
    let service = redis
        .iter()
        .find(|d| text(d, "/kind") == "Service")
        .expect("redis.yaml's Service");
    let port = text(&array(service, "/spec/ports")[0], "/port");
    let address = format!("{}:{port}", text(service, "/metadata/name"));
    assert_eq!(url, &format!("redis://{address}/"));
    // Its pods are the ones the Service selects.
    let redis_deployment = redis
        .iter()
        .find(|d| text(d, "/kind") == "Deployment")
        .expect("redis.yaml's Deployment");
    for (key, value) in
        service["spec"]["selector"].as_object().expect("a selector")
    {
        assert_eq!(
            redis_deployment["spec"]["template"]["metadata"]["labels"][key],
            *value
        );
    }
    // kubectl apply -k applies it.
    let kustomization = k8s("kustomization.yaml");
    let resources: Vec<&str> = array(&kustomization, "/resources")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for file in [
        "configmap.yaml",
        "deployment.yaml",
        "redis.yaml",
        "service.yaml",
    ] {
        assert!(resources.contains(&file), "{file} in kustomization.yaml");
    }
    // The drain ends before Kubernetes kills the pod.
    let grace: u64 = text(
        &deployment,
        "/spec/template/spec/terminationGracePeriodSeconds",
    )
    .parse()
    .expect("seconds");
    assert!(
        serve.drain.as_secs() < grace,
        "{:?} < {grace} s",
        serve.drain
    );
}

#[test]
fn the_service_selects_the_pods_and_their_ports() {
    let deployment = k8s("deployment.yaml");
    let service = k8s("service.yaml");
    assert_eq!(text(&service, "/kind"), "Service");
    let labels = deployment["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels");
    for (key, value) in
        service["spec"]["selector"].as_object().expect("a selector")
    {
        assert_eq!(labels.get(key), Some(value), "selector {key}");
    }
    let container = container(&deployment);
    let mut ports = Vec::new();
    for port in array(&service, "/spec/ports") {
        let target = container_port(container, text(port, "/targetPort"));
        // Headless: clients reach the pods' own ports.
        assert_eq!(text(port, "/port"), target, "{port}");
        ports.push(target);
    }
    ports.sort();
    let mut defaults = vec![grpc_port().to_string(), http_port().to_string()];
    defaults.sort();
    assert_eq!(ports, defaults);
}

/// A ConfigMap volume as the kubelet lays it out (each file a link into
/// `..data`, itself a link to a hidden timestamped directory, swapped on an
/// update) is read as the ConfigMap's files, without warnings.
#[test]
fn a_configmap_volume_loads_as_its_files() {
    let dir = TempDir::new();
    let configmap = k8s("configmap.yaml");
    let data = configmap["data"].as_object().expect("data");
    for (name, text) in data {
        dir.write(
            &format!("..2026_01_01_00_00_00.1/{name}"),
            text.as_str().expect("a file"),
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::symlink;
        symlink("..2026_01_01_00_00_00.1", dir.path().join("..data"))
            .expect("ln -s");
        for name in data.keys() {
            symlink(format!("..data/{name}"), dir.path().join(name))
                .expect("ln -s");
        }
        let config = Config::load(dir.path()).expect("the mounted rules");
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
        assert_eq!(config.rule_count(), configmap_rules().rule_count());
        assert_eq!(config.domains().collect::<Vec<_>>(), ["edge"]);
    }
}

// --- docker compose -----------------------------------------------------------

/// An Envoy cluster's one endpoint: its host and port.
fn envoy_endpoint(envoy: &Value, cluster: &str) -> (String, String) {
    let cluster = array(envoy, "/static_resources/clusters")
        .iter()
        .find(|c| text(c, "/name") == cluster)
        .unwrap_or_else(|| panic!("no cluster {cluster}"));
    let address = cluster
        .pointer("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
        .expect("an endpoint");
    (
        text(address, "/address").to_owned(),
        text(address, "/port_value").to_owned(),
    )
}

/// Where a compose service mounts `source` (relative to the compose
/// file): its path in the container.
fn mount_of(service: &Value, source: &str) -> String {
    array(service, "/volumes")
        .iter()
        .filter_map(Value::as_str)
        .find_map(|volume| {
            let mut parts = volume.split(':');
            (parts.next() == Some(source))
                .then(|| parts.next().expect("a target").to_owned())
        })
        .unwrap_or_else(|| panic!("{source} is not mounted: {service}"))
}

#[test]
fn the_compose_file_wires_envoy_the_service_redis_and_the_app() {
    let compose = yaml(&read("examples/compose/compose.yaml")).remove(0);
    let services = compose["services"].as_object().expect("services");
    let service = |name: &str| {
        services
            .get(name)
            .unwrap_or_else(|| panic!("no compose service {name}"))
    };

    // Envoy's clusters are compose services, on the ports they serve.
    let envoy = envoy();
    let (rls_host, rls_port) = envoy_endpoint(&envoy, "rate_limit_service");
    assert_eq!(rls_port, grpc_port().to_string());
    let ratelimit = service(&rls_host);
    let (app_host, app_port) = envoy_endpoint(&envoy, "app");
    let app_command: Vec<&str> = array(service(&app_host), "/command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        app_command.contains(&format!("-listen=:{app_port}").as_str()),
        "{app_command:?}"
    );
    // Envoy reads this repository's envoy.yaml, where its command says.
    let envoy_service = service("envoy");
    let config = mount_of(envoy_service, "../envoy/envoy.yaml");
    let command: Vec<&str> = array(envoy_service, "/command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        command.windows(2).any(|w| w == ["-c", config.as_str()]),
        "{command:?}"
    );

    // The service: the image's environment, then the compose file's.
    let mut env = image_env(&runtime_stage());
    for (name, value) in ratelimit["environment"].as_object().expect("a map") {
        env.retain(|(k, _)| k != name);
        env.push((name.clone(), value.as_str().expect("text").to_owned()));
    }
    let serve = assert_listens_on_the_defaults(&[], &env);
    // Its rules are examples/ratelimit, where its environment points.
    let rules = mount_of(ratelimit, "../ratelimit");
    assert_eq!(serve.options.config_path, PathBuf::from(rules));
    // Its limits are shared through the compose file's Redis.
    let StoreChoice::Redis(url) = &serve.options.store else {
        panic!("a shared store: {:?}", serve.options.store);
    };
    assert!(services.contains_key("redis"));
    assert_eq!(url, "redis://redis:6379/");
    assert_eq!(
        text(ratelimit, "/build/context"),
        "../..",
        "the repository's Dockerfile"
    );
}
