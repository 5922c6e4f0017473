//! The router: every route, the API key check, the body limit, 404s in the caller's dialect,
//! and the small routes (health, models, props, metrics, tokenize, detokenize, openapi).

use crate::error::{ApiError, ApiResult, Dialect, Kind};
use crate::params::{parse_object, Body};
use crate::common::{body, AppState};
use crate::{anthropic, openai, responses, App};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderMap, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

/// The OpenAPI document of every route (served at /openapi.json).
pub const OPENAPI: &str = include_str!("openapi.json");

/// The chat page (served at /): one self-contained file, no fetch but this server's routes.
pub const CHAT_PAGE: &str = include_str!("chat.html");

pub fn router(app: Arc<App>, max_body: usize) -> Router {
    Router::new()
        .route("/", get(chat_page))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/completions", post(openai::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/responses", post(responses::responses))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/props", get(props))
        .route("/apply-template", post(openai::apply_template))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), auth))
        .layer(middleware::from_fn_with_state(app.clone(), access_log))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app)
}

async fn chat_page() -> axum::response::Html<&'static str> {
    axum::response::Html(CHAT_PAGE)
}

/// With `xwen serve -v`: one line on stderr per request, as llama-server logs them: the
/// client, the method and path, the status, and the time to the response's head (a stream's
/// body goes on after it).
async fn access_log(State(app): AppState, req: Request, next: Next) -> Response {
    if !app.access_log {
        return next.run(req).await;
    }
    let peer = req.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.to_string());
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t0 = std::time::Instant::now();
    let r = next.run(req).await;
    eprintln!(
        "xwen: {} {method} {path} {} {:.1} ms",
        peer.as_deref().unwrap_or("-"),
        r.status().as_u16(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    r
}

/// With `--api-key`, every route but /health needs `Authorization: Bearer KEY` or `x-api-key`.
async fn auth(State(app): AppState, req: Request, next: Next) -> Response {
    let Some(key) = app.api_key.as_deref() else { return next.run(req).await };
    let path = req.uri().path();
    // the page is the same for everyone; it sends the key the user gives it with each request
    if path == "/health" || path == "/v1/health" || path == "/" {
        return next.run(req).await;
    }
    let h = req.headers();
    let bearer = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    let xkey = h.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
    if bearer == Some(key) || xkey == Some(key) {
        return next.run(req).await;
    }
    let d = Dialect::of_path(path);
    let msg = if bearer.is_none() && xkey.is_none() { "an API key is required (Authorization: Bearer KEY or x-api-key)" } else { "the API key is not valid" };
    let mut e = ApiError::new(d, Kind::Unauthorized, msg);
    if d == Dialect::OpenAi {
        e = e.with_code("invalid_api_key");
    }
    e.into_response()
}

async fn not_found(uri: Uri) -> ApiError {
    let path = uri.path();
    ApiError::new(Dialect::of_path(path), Kind::NotFound, format!("no route {path}"))
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

fn model_json(app: &App) -> Value {
    json!({
        "id": app.model_id(),
        "object": "model",
        "created": app.created,
        "owned_by": "xwen",
        "meta": {"architecture": app.architecture, "n_ctx": app.max_ctx, "n_vocab": app.tok.vocab_size()},
    })
}

async fn models(State(app): AppState) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_json(&app)]}))
}

async fn model_by_id(State(app): AppState, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    app.check_model(Dialect::OpenAi, Some(&id))?;
    Ok(Json(model_json(&app)))
}

async fn metrics(State(app): AppState) -> Response {
    app.metrics.set_queue(app.engine.queued());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.metrics.render()).into_response()
}

async fn props(State(app): AppState) -> Json<Value> {
    Json(json!({
        "model_alias": app.model_id(),
        "architecture": app.architecture,
        "total_slots": app.parallel,
        "n_ctx": app.max_ctx,
        "default_generation_settings": {"n_ctx": app.max_ctx},
        "chat_template_present": app.template.is_some(),
        "modalities": {"vision": false, "audio": false},
        "build_info": format!("xwen {}", env!("CARGO_PKG_VERSION")),
    }))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// llama-server's /tokenize: `{content, with_pieces?}` → `{tokens}`.
async fn tokenize(State(app): AppState, _h: HeaderMap, b: Result<Bytes, BytesRejection>) -> ApiResult<Json<Value>> {
    let d = Dialect::OpenAi;
    let o = parse_object(d, &body(d, app.max_body, b)?)?;
    let req = Body::new(d, &o);
    let content = req.str("content")?.ok_or_else(|| req.err("content", "`content` (a string) is required"))?;
    let pieces = req.bool("with_pieces")?.unwrap_or(false);
    let ids = app.tok.encode(content);
    if pieces {
        let t: Vec<Value> = ids
            .iter()
            .map(|&id| {
                let b = app.tok.token_bytes(id);
                match std::str::from_utf8(b) {
                    Ok(s) => json!({"id": id, "piece": s}),
                    Err(_) => json!({"id": id, "piece": b}),
                }
            })
            .collect();
        return Ok(Json(json!({"tokens": t})));
    }
    Ok(Json(json!({"tokens": ids})))
}

/// llama-server's /detokenize: `{tokens}` → `{content}`.
async fn detokenize(State(app): AppState, b: Result<Bytes, BytesRejection>) -> ApiResult<Json<Value>> {
    let d = Dialect::OpenAi;
    let o = parse_object(d, &body(d, app.max_body, b)?)?;
    let req = Body::new(d, &o);
    let toks = req.array("tokens")?.ok_or_else(|| req.err("tokens", "`tokens` (an array of token ids) is required"))?;
    let vocab = app.tok.vocab_size();
    let ids = toks
        .iter()
        .map(|t| t.as_u64().filter(|&x| (x as usize) < vocab).map(|x| x as u32).ok_or_else(|| req.err("tokens", format!("`tokens` must hold token ids below {vocab}"))))
        .collect::<ApiResult<Vec<u32>>>()?;
    Ok(Json(json!({"content": app.tok.decode(&ids)})))
}
