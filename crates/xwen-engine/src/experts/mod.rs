//! Where routed experts come from and what RAM they may take: the `ExpertStore` seam (`store`),
//! experts mapped from the file or streamed from disk with direct I/O (`streamed`,
//! `direct_read`) into a bounded cache (`cache`), under the RAM plan (`plan`), the next layer's
//! likely experts read ahead as far as the guesses have earned (`prefetch`); the cache policy
//! judged against LRU and Belady's optimum on routing traces (`replay`). The rows of a huge
//! lookup table (qwen4exp's PLE n-gram table) stream the same way (`rows`, into the bounded
//! `row_cache`), under the same plan.

pub mod cache;
pub mod direct_read;
pub mod pack;
pub mod prefetch;
pub mod replay;
pub mod row_cache;
pub mod rows;
pub mod store;
pub mod streamed;
