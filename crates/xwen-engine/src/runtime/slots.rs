//! The engine's slots: the sessions kept between requests, so a conversation's next turn
//! prefills only its new tokens, the prefix cache of states at message boundaries beyond them,
//! and the drafter that followed each slot's session. A new request takes the idle session
//! holding the longest prefix of its prompt (or the cache's state where that holds more).

use crate::model::Model;
use crate::runtime::prefix_cache::PrefixCache;
use crate::runtime::state_reads::StateReads;
use crate::state::HostAt;
use crate::runtime::scheduler::Ended;
use crate::runtime::session::Session;
use crate::runtime::speculative::{DflashDrafter, DraftMemory, Drafter, ModelDrafter, MtpDrafter, NgramDrafter};
use std::sync::Arc;

/// How the slots draft: with what, at most how many tokens a step, and below which top
/// probability a model drafter (a draft model, the MTP head) stops (llama.cpp's p_min).
#[derive(Clone, Debug)]
pub struct DraftSettings {
    pub source: DraftSource,
    pub max: usize,
    pub p_min: f32,
}

/// Where drafts come from.
#[derive(Clone)]
pub enum DraftSource {
    /// Prompt lookup (n-gram): no model.
    Ngram,
    /// The served model's own MTP head (its nextn block, or a sidecar attached to it).
    Mtp,
    /// The DFlash block drafter attached to the served model (`Model::attach_dflash`).
    Dflash,
    /// A smaller model with the served model's vocabulary, shared by every slot; each slot's
    /// drafter keeps its own state of it.
    Model(Arc<Model>),
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSource::Ngram => f.write_str("Ngram"),
            DraftSource::Mtp => f.write_str("Mtp"),
            DraftSource::Dflash => f.write_str("Dflash"),
            DraftSource::Model(m) => write!(f, "Model({})", m.name().unwrap_or(m.architecture())),
        }
    }
}

/// A drafter that followed a slot's session, with what its controller learned there.
pub(crate) type KeptDrafter = (Box<dyn Drafter>, Option<DraftMemory>);

/// A request's drafter with its greatest depth, and what a controller learned before (None:
/// a new drafter).
pub(crate) type RequestDrafter = ((Box<dyn Drafter>, usize), Option<DraftMemory>);

struct Slot {
    session: Session,
    /// The drafter of the slot's last request, which followed its session, with what its
    /// controller learned.
    drafter: Option<KeptDrafter>,
    last_used: u64,
}

/// Where a request's session came from (for the observer's counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Picked {
    Idle,
    Fresh,
    /// The prefix cache's state (from disk or RAM).
    Cache {
        from_disk: bool,
    },
}

pub(crate) struct Slots {
    idle: Vec<Slot>,
    /// Sessions in existence (idle or running), at most `parallel`.
    sessions: usize,
    parallel: usize,
    clock: u64,
    /// States at message boundaries, beyond the slots' own (RAM, and disk across restarts).
    prefix: Option<PrefixCache>,
    /// Ended requests' states on their way into `prefix` (read back from a device off this
    /// thread).
    reads: StateReads,
}

impl Slots {
    pub(crate) fn new(parallel: usize, prefix: Option<PrefixCache>) -> Slots {
        Slots { idle: Vec::new(), sessions: 0, parallel, clock: 0, prefix, reads: StateReads::default() }
    }

    /// The idle session sharing the longest prefix with `prompt`, or the prefix cache's state
    /// where that holds more of it; on a tie (or none shared), the least recently used, so a long
    /// conversation's slot survives short one-off requests. An idle slot comes with the drafter
    /// that followed its session.
    pub(crate) fn pick(&mut self, model: &Model, prompt: &[u32]) -> (Session, Option<KeptDrafter>, Picked) {
        let common = |s: &Session| s.tokens().iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let best_idle = self.idle.iter().map(|s| common(&s.session)).max().unwrap_or(0);
        // an ended request's state still being read back waits where it would serve more
        if let Some(c) = self.prefix.as_mut() {
            self.reads.settle(c, Some((prompt, best_idle)));
        }
        if let Some(hit) = self.prefix.as_mut().and_then(|c| c.lookup(model, prompt, best_idle)) {
            if let Ok(session) = Session::resume(prompt[..hit.len].to_vec(), hit.state) {
                // the resumed state takes a fresh slot, or the least recently used idle one
                if self.sessions < self.parallel {
                    self.sessions += 1;
                } else if let Some(lru) = self.idle.iter().enumerate().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i) {
                    self.idle.swap_remove(lru);
                }
                return (session, None, Picked::Cache { from_disk: hit.from_disk });
            }
        }
        if self.idle.is_empty() {
            self.sessions += 1;
            return (Session::new(model), None, Picked::Fresh);
        }
        let mut best = 0;
        let mut key = (0, u64::MAX);
        for (i, slot) in self.idle.iter().enumerate() {
            let c = common(&slot.session);
            let k = (c, u64::MAX - slot.last_used);
            if i == 0 || k > key {
                best = i;
                key = k;
            }
        }
        // nothing shared: a fresh session if one more fits, so cached conversations stay
        if key.0 == 0 && self.sessions < self.parallel {
            self.sessions += 1;
            return (Session::new(model), None, Picked::Fresh);
        }
        let slot = self.idle.swap_remove(best);
        (slot.session, slot.drafter, Picked::Idle)
    }

    /// An empty session for a prompt on its own (`EngineRequest::one_shot`): a fresh one where
    /// one more fits, else the least recently used idle slot's, emptied, without the drafter
    /// that followed it (that drafter's state holds the conversation the session forgot).
    pub(crate) fn pick_empty(&mut self, model: &Model) -> (Session, Option<KeptDrafter>, Picked) {
        let lru = self.idle.iter().enumerate().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i);
        match lru {
            Some(i) if self.sessions >= self.parallel => {
                let mut slot = self.idle.swap_remove(i);
                slot.session.reset(model);
                (slot.session, None, Picked::Fresh)
            }
            _ => {
                self.sessions += 1;
                (Session::new(model), None, Picked::Fresh)
            }
        }
    }

    /// The session of an ended sequence goes back to the idle slots; its state at the prompt's
    /// message `boundary` goes to the prefix cache. None: the sequence left without its
    /// session (failed), so its slot is rebuilt when needed.
    pub(crate) fn release(&mut self, ended: Option<Ended>, boundary: Option<usize>) {
        match ended {
            Some(Ended { session, drafter, draft_memory, .. }) => {
                let drafter = drafter.map(|d| (d, draft_memory));
                if let (Some(cache), Some(b)) = (self.prefix.as_mut(), boundary) {
                    // a device's checkpoint is read back off this thread, its KV rows now
                    match session.host_at(b) {
                        Some((tokens, HostAt::Ready(state))) => cache.insert(&tokens, state),
                        Some((tokens, at)) => self.reads.send(tokens, at, cache),
                        None => {}
                    }
                    self.reads.settle(cache, None);
                }
                self.clock += 1;
                self.idle.push(Slot { session, drafter, last_used: self.clock });
            }
            None => self.lost(),
        }
    }

    /// Every idle session forgets what it holds (a caller's new conversation); the drafters
    /// that followed them stay.
    pub(crate) fn reset_sessions(&mut self, model: &Model) {
        for slot in &mut self.idle {
            slot.session.reset(model);
        }
    }

    /// A session went away with its request (refused, or its state is past repair).
    pub(crate) fn lost(&mut self) {
        self.sessions -= 1;
    }

    /// The prefix cache's states written so far reach the disk.
    /// The prefix cache's notes since the last call (`PrefixCache::take_notes`).
    pub(crate) fn take_notes(&self) -> Vec<String> {
        self.prefix.as_ref().map(PrefixCache::take_notes).unwrap_or_default()
    }

    pub(crate) fn flush(&mut self) {
        if let Some(p) = self.prefix.as_mut() {
            self.reads.finish_all(p);
            p.flush();
        }
    }
}

/// A drafter for a new request: the slot's own where it has one, else a new one of `cfg`'s kind.
/// Without settings a slot's drafter is one a caller gave an earlier request
/// (`EngineRequest::draft`): it drafts on, to the depth it was given.
pub(crate) fn request_drafter(cfg: Option<&DraftSettings>, kept: Option<KeptDrafter>) -> Option<RequestDrafter> {
    let Some(cfg) = cfg else {
        let (d, memory) = kept?;
        let depth = memory.as_ref()?.0.max_depth();
        return Some(((d, depth), memory));
    };
    let d: Box<dyn Drafter> = match (&cfg.source, kept) {
        (_, Some((d, memory))) => return Some(((d, cfg.max), memory)),
        (DraftSource::Ngram, None) => Box::new(NgramDrafter::default()),
        (DraftSource::Mtp, None) => {
            let mut d = MtpDrafter::new();
            d.p_min = cfg.p_min;
            Box::new(d)
        }
        (DraftSource::Dflash, None) => {
            let mut d = DflashDrafter::new();
            d.p_min = cfg.p_min;
            Box::new(d)
        }
        (DraftSource::Model(m), None) => {
            let mut d = ModelDrafter::new(m.clone(), cfg.max);
            d.p_min = cfg.p_min;
            Box::new(d)
        }
    };
    Some(((d, cfg.max), None))
}
