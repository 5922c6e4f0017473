//! What every route shares: the state extractor, the request body with the body-limit's
//! error, ids, and server-sent events.

use crate::error::{ApiError, ApiResult, Dialect, Kind};
use crate::App;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

pub type AppState = State<Arc<App>>;

/// The body, or the error its rejection means (413 above `limit`, named with the flag that
/// raises it).
pub fn body(d: Dialect, limit: usize, b: Result<Bytes, BytesRejection>) -> ApiResult<Bytes> {
    b.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(d, Kind::TooLarge, format!("the request body is larger than the {} this server accepts (xwen serve --max-body raises it)", size_text(limit)))
        } else {
            ApiError::bad(d, format!("the request body could not be read: {e}"))
        }
    })
}

/// A byte count as `--max-body` takes it: `8M`, `512K`, or bytes.
pub fn size_text(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// A random-looking id with a prefix (`chatcmpl-…`, `call_…`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{:016x}{:08x}", crate::params::random_seed(), crate::params::random_seed() as u32)
}

/// A streamed reply: SSE events from a task that reads the generation; a client that goes away
/// drops the receiver, which ends the task and (through `Gen`'s drop) the sequence.
pub fn sse(rx: mpsc::Receiver<Result<Event, Infallible>>) -> Response {
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default()).into_response()
}

pub fn data(v: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(v.to_string()))
}


/// A generation route's answer, counted in /metrics (requests, and errors by their response).
pub async fn counted(app: &App, answer: impl std::future::Future<Output = ApiResult<Response>>) -> Response {
    app.metrics.requests.inc();
    match answer.await {
        Ok(r) => r,
        Err(e) => {
            app.metrics.errors.inc();
            e.into_response()
        }
    }
}
