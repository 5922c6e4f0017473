//! `/metrics`: Prometheus text exposition (prometheus-client) of what the server did — requests,
//! tokens in and out, the prefix cache's share of prompt tokens, queue depth, batch size,
//! generation speed and the expert cache's hit rate when experts stream.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use prometheus_client::metrics::family::Family;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use xwen_engine::{DraftTally, StepReport};

type FGauge = Gauge<f64, AtomicU64>;
type FCounter = Counter<f64, AtomicU64>;

#[derive(Default)]
pub struct Metrics {
    pub requests: Counter,
    pub errors: Counter,
    pub prompt_tokens: Counter,
    pub cached_tokens: Counter,
    pub generated_tokens: Counter,
    pub cancelled: Counter,
    /// What the slots' drafting did (`serve --draft`): the scheduler's running tally.
    drafts: Mutex<DraftTally>,
    /// Prompts that resumed a prefix-cache state read from disk (`serve --cache-dir`).
    pub prefix_disk_hits: Counter,
    /// Prompts that resumed any prefix-cache state (RAM or disk).
    pub prefix_hits: Counter,
    queue_depth: Gauge,
    running: Gauge,
    batch_size: Gauge,
    step_seconds: FCounter,
    steps: Counter,
    /// Where the steps' time went: the forwards, the checkpoints after them, the ended
    /// requests' slots (prefix-cache copies); the steps a prompt joined, and their prompts.
    forward_seconds: FCounter,
    checkpoint_seconds: FCounter,
    release_seconds: FCounter,
    prompt_steps: Counter,
    prompt_step_seconds: FCounter,
    prompts_fed: Counter,
    tokens_per_second: FGauge,
    expert_hits: Gauge,
    expert_misses: Gauge,
    expert_hit_rate: FGauge,
    prefix_hit_rate: FGauge,
}

impl Metrics {
    pub fn set_queue(&self, queued: usize) {
        self.queue_depth.set(queued as i64);
    }

    pub fn set_load(&self, queued: usize, running: usize) {
        self.queue_depth.set(queued as i64);
        self.running.set(running as i64);
    }

    /// One engine step: its sequences, the tokens it sampled, and where its time went.
    pub fn record_step(&self, s: &StepReport) {
        self.batch_size.set(s.sequences as i64);
        self.steps.inc();
        self.step_seconds.inc_by(s.secs);
        self.generated_tokens.inc_by(s.tokens);
        self.forward_seconds.inc_by(s.shape.forward_secs);
        self.checkpoint_seconds.inc_by(s.shape.checkpoint_secs);
        self.release_seconds.inc_by(s.release_secs);
        if s.shape.prompts > 0 {
            self.prompt_steps.inc();
            self.prompt_step_seconds.inc_by(s.secs);
            self.prompts_fed.inc_by(s.shape.prompts as u64);
        }
        if s.secs > 0.0 && s.tokens > 0 {
            self.tokens_per_second.set(s.tokens as f64 / s.secs);
        }
    }

    /// The drafting tally so far (the engine observer's `drafts`).
    pub fn set_drafts(&self, tally: &DraftTally) {
        self.drafts.lock().unwrap_or_else(|p| p.into_inner()).clone_from(tally);
    }

    pub fn set_expert_cache(&self, hits: u64, misses: u64) {
        self.expert_hits.set(hits as i64);
        self.expert_misses.set(misses as i64);
        if hits + misses > 0 {
            self.expert_hit_rate.set(hits as f64 / (hits + misses) as f64);
        }
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let prompt = self.prompt_tokens.get();
        if prompt > 0 {
            self.prefix_hit_rate.set(self.cached_tokens.get() as f64 / prompt as f64);
        }
        let mut r = Registry::with_prefix("xwen");
        r.register("requests", "HTTP generation requests received", self.requests.clone());
        r.register("request_errors", "Requests answered with an error status", self.errors.clone());
        r.register("prompt_tokens", "Prompt tokens of admitted requests", self.prompt_tokens.clone());
        r.register("prompt_tokens_cached", "Prompt tokens served from the prefix cache (not computed)", self.cached_tokens.clone());
        r.register("generated_tokens", "Tokens sampled", self.generated_tokens.clone());
        r.register("requests_cancelled", "Requests stopped early: running or queued, their client gone, or a stop string matched", self.cancelled.clone());
        let drafts = self.drafts.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let counter = |v: u64| {
            let c: Counter = Counter::default();
            c.inc_by(v);
            c
        };
        r.register("draft_tokens", "Draft tokens verified (serve --draft)", counter(drafts.drafted()));
        r.register("draft_tokens_accepted", "Draft tokens accepted (serve --draft)", counter(drafts.accepted()));
        r.register("spec_decode_verify_steps", "Verify steps that checked drafted tokens (serve --draft)", counter(drafts.verify_steps));
        // one series per draft position, as llama-server's
        // llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
        let per_pos = |counts: &[u64]| {
            let f: Family<Vec<(String, String)>, Counter> = Family::default();
            for (i, &v) in counts.iter().enumerate() {
                f.get_or_create(&vec![("position".to_string(), i.to_string())]).inc_by(v);
            }
            f
        };
        r.register("spec_decode_num_drafted_tokens_per_pos", "Drafted tokens verified per draft position (0: a step's first)", per_pos(&drafts.drafted_at));
        r.register("spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position (0: a step's first)", per_pos(&drafts.accepted_at));
        r.register("queue_depth", "Requests waiting for a slot", self.queue_depth.clone());
        r.register("running_sequences", "Sequences in the running batch", self.running.clone());
        r.register("batch_size", "Sequences in the last engine step", self.batch_size.clone());
        r.register("engine_steps", "Batched forward steps run", self.steps.clone());
        r.register("engine_step_seconds", "Time spent in batched forward steps", self.step_seconds.clone());
        r.register("engine_forward_seconds", "Time the steps spent in the model's forward passes", self.forward_seconds.clone());
        r.register("engine_checkpoint_seconds", "Time the steps spent taking checkpoints after their forwards (on a GPU a copy on the card, or a read-back where it has no room)", self.checkpoint_seconds.clone());
        r.register("engine_release_seconds", "Time the steps spent releasing ended requests' slots (the prefix cache's copies of their states; on a GPU their KV rows, the recurrent states read back off the step)", self.release_seconds.clone());
        r.register("engine_prompt_steps", "Steps in which some sequence fed prompt tokens", self.prompt_steps.clone());
        r.register("engine_prompt_step_seconds", "Time spent in steps in which some sequence fed prompt tokens", self.prompt_step_seconds.clone());
        r.register("engine_prompt_spans", "Prompt chunks fed (one a sequence a step)", self.prompts_fed.clone());
        r.register("tokens_per_second", "Tokens sampled per second in the last step", self.tokens_per_second.clone());
        r.register("prefix_cache_restores", "Prompts resumed from a prefix-cache state (not a slot's own)", self.prefix_hits.clone());
        r.register("prefix_cache_disk_restores", "Prompts resumed from a prefix-cache state read from disk", self.prefix_disk_hits.clone());
        r.register("prefix_cache_hit_rate", "Share of prompt tokens served from the prefix cache", self.prefix_hit_rate.clone());
        r.register("expert_cache_hits", "Routed-expert cache hits (streamed experts)", self.expert_hits.clone());
        r.register("expert_cache_misses", "Routed-expert cache misses (streamed experts)", self.expert_misses.clone());
        r.register("expert_cache_hit_rate", "Routed-expert cache hit rate (streamed experts)", self.expert_hit_rate.clone());
        let mut out = String::new();
        // writing into a String cannot fail
        let _ = encode(&mut out, &r);
        out
    }
}
