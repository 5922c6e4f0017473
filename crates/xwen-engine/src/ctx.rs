//! The context a forward pass runs in: the backend its ops run on (`backend`), the mapped file
//! the weights live in, the profiler, and what the forward records (routes, taps). Matrix
//! products go through here so every block names its weights (`Mat`) and the backend gets
//! them resolved against the file.

use crate::backend::{Backend, Buf, MvJob};
use crate::batch::Rows;
use crate::profile::{Op, Profiler, Span};
use crate::weights::Mat;
use xwen_gguf::GgufFile;
use xwen_kernels::QMatrix;

use crate::backend::AttnMode;

pub struct Ctx<'a> {
    pub backend: &'a dyn Backend,
    pub file: &'a GgufFile,
    pub prof: &'a Profiler,
    /// Use the chunked DeltaNet form for multi-token prefill.
    pub chunked_scan: bool,
    /// Where MoE layers record their routing decisions (`EngineConfig::record_routes`).
    pub routes: Option<&'a std::sync::Mutex<Vec<RouteRecord>>>,
    /// Flash attention or the plain path (`EngineConfig::flash_attn`).
    pub attn: AttnMode,
    /// Where the layers record named intermediate tensors (`EngineConfig::record_taps`).
    pub taps: Option<&'a std::sync::Mutex<Vec<Tap>>>,
    /// Where a batched forward collects failed expert reads so only the sequences that needed
    /// them fail (`Model::forward_batch_each`); None: a failed read fails the forward.
    pub faults: Option<&'a std::sync::Mutex<Vec<ReadFault>>>,
    /// The tables whose rows stream from disk under a RAM budget (`experts::rows`); None, or a
    /// table it does not hold: rows come from the mapping.
    pub rows: Option<&'a crate::experts::rows::StreamedRows>,
    /// Layers whose inputs (the pre-norm residual stream entering them, llama.cpp's
    /// `t_layer_inp`) a step's hidden rows return, side by side, instead of the final hidden: a
    /// DFlash drafter's features. Empty: the final hidden.
    pub layer_inputs: &'a [usize],
    /// This model's rank of a sharded model (`crate::shard`): MoE layers compute its experts'
    /// picks and reduce every pick's output over the group. None: every expert here.
    pub shard: Option<&'a crate::shard::Shard>,
}

/// An expert read (or a streamed table rows' read) that failed during a batched forward, and the
/// batch rows that needed it. Those rows take zeros for that expert (those rows) and their sequences fail when the forward ends; every
/// other row is computed as if it never happened (a row's result depends on its own experts
/// only: batch invariance).
#[derive(Debug)]
pub struct ReadFault {
    pub rows: Vec<usize>,
    pub error: crate::error::EngineError,
}

/// One named intermediate tensor of a forward, in llama.cpp's `cb(cur, name, il)` names
/// (`attn_norm-3`, `l_out-3`, `result_norm`): `rows` × `width`, row-major — ggml's ne0 = width,
/// ne1 = rows — to compare with `tools/oracle/llama_dump.cpp`'s dumps.
#[derive(Clone, Debug)]
pub struct Tap {
    pub name: String,
    pub width: usize,
    pub data: Vec<f32>,
}

/// One MoE routing decision: `row` of the forward's batch at `layer`.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteRecord {
    pub row: usize,
    pub layer: usize,
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
    pub margin: f32,
    /// The next MoE layer and the experts this row's input guessed for it (decode rows of a
    /// model with a next MoE layer; `moe::Lookahead`).
    pub next_guess: Option<(usize, Vec<usize>)>,
}

impl<'a> Ctx<'a> {
    /// An expert read (or a table rows' read) that batch rows `rows` needed failed: recorded where the forward isolates
    /// failures (`faults`), else the forward's error.
    pub fn expert_failed(&self, rows: Vec<usize>, error: crate::error::EngineError) -> crate::error::Result<()> {
        match self.faults {
            Some(f) => {
                f.lock().unwrap_or_else(|p| p.into_inner()).push(ReadFault { rows, error });
                Ok(())
            }
            None => Err(error),
        }
    }

    pub fn span(&self, op: Op) -> Span<'_> {
        self.prof.span(op)
    }

    /// Whether MoE layers record their routing decisions in this forward.
    pub fn records_routes(&self) -> bool {
        self.routes.is_some()
    }

    /// Records `data` (rows of `width`) as `name` (with `-{il}` when a layer is given) when the
    /// forward records taps; nothing otherwise (no copy).
    pub fn tap(&self, name: &str, il: Option<usize>, data: &[f32], width: usize) {
        if let Some(sink) = self.taps {
            let name = match il {
                Some(il) => format!("{name}-{il}"),
                None => name.to_string(),
            };
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(Tap { name, width, data: data.to_vec() });
        }
    }

    /// Appends routing decisions to the forward's record (nothing when it records none).
    pub fn push_routes(&self, recs: Vec<RouteRecord>) {
        if let Some(sink) = self.routes {
            sink.lock().unwrap_or_else(|p| p.into_inner()).extend(recs);
        }
    }

    /// `w` resolved against this forward's file: the one place a block's weight becomes the
    /// bytes a backend multiplies (a device backend would resolve it to its own copy).
    pub fn q(&self, w: &Mat) -> QMatrix<'a> {
        w.q(self.file)
    }

    /// Rows `ids` of the lookup table `table` (each below `table.rows`), dequantized into
    /// `out` (row i at `out[i·cols..]`): streamed where the table streams (`experts::rows`: the
    /// step's rows deduplicated and read together), else from the mapping — the same bytes
    /// either way. A failed read leaves its rows as they were and comes back with their places
    /// in `ids`; an error is of the forward as a whole.
    pub fn table_rows(&self, table: &Mat, ids: &[usize], out: &mut [f32]) -> crate::error::Result<Option<crate::experts::rows::RowsFailed>> {
        if let Some((s, t)) = self.rows.and_then(|s| s.table_of(table).map(|t| (s, t))) {
            return s.gather(t, ids, out);
        }
        let q = self.q(table);
        let rb = table.row_bytes();
        for (i, &r) in ids.iter().enumerate() {
            xwen_kernels::dequantize(q.ty, &q.data[r * rb..(r + 1) * rb], &mut out[i * table.cols..(i + 1) * table.cols])
                .map_err(|e| crate::error::EngineError::State(format!("table {}: {e}", table.info.name)))?;
        }
        Ok(None)
    }

    /// y = x · Wᵀ for `n` rows of x (each `w.cols` long) of one sequence; returns n × w.rows.
    pub fn mm(&self, w: &Mat, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; n * w.rows];
        self.mm_into(self.q(w), x, n, &mut y);
        y
    }

    /// Products of several matrices with the same input rows of a batch (`Backend::mm_rows`):
    /// q/k/v, gate/up — batch-invariant, one weight pass for all decode rows.
    pub fn mm_rows(&self, ws: &[&Mat], x: &[f32], rows: &Rows) -> Vec<Buf<'a>> {
        let qs: Vec<QMatrix> = ws.iter().map(|w| self.q(w)).collect();
        self.backend.mm_rows(&qs, x, rows)
    }

    /// `n` zeros in a buffer of the backend's arena (an activation of this forward).
    pub fn zeros(&self, n: usize) -> Buf<'a> {
        self.backend.scratch().zeros(n)
    }

    /// `mm_rows` of one matrix.
    pub fn mm_rows1(&self, w: &Mat, x: &[f32], rows: &Rows) -> Buf<'a> {
        self.mm_rows(&[w], x, rows).pop().expect("one matrix, one product")
    }

    /// `n` rows of one sequence: matrix × vector for one, a batched matmul for more.
    pub fn mm_into(&self, w: QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
        debug_assert_eq!(x.len(), n * w.cols);
        debug_assert_eq!(y.len(), n * w.rows);
        if n == 1 {
            self.backend.matvec(w, x, y);
        } else {
            self.backend.matmul(w, x, n, y);
        }
    }

    /// Several independent matrix × vector products in one job (`Backend::mv_batch`).
    pub fn mv_batch(&self, jobs: &mut [MvJob]) {
        self.backend.mv_batch(jobs);
    }
}
