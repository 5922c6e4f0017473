//! Model names to local files, cache first: a path, an official checkpoint's name, or a
//! Hugging Face repo (and file or quantization) resolves through the Hugging Face cache and is
//! downloaded into it on a miss — resumable, checked against the hub's sha256, offline-aware.
//! Its own crate so the CLI and any other front end (a server that loads models by name) share
//! one resolver, and an engine change does not rebuild the TLS stack.

pub mod download;
pub mod hub;

pub use hub::resolve;
