//! A sequence state as bytes, for the prefix cache's disk copies (`runtime::prefix_cache`): every
//! layer's KV rows in the cache's own element type and every recurrent layer's conv and delta
//! state, after a header that says what model and cache types they belong to. Reading checks
//! the shape against the model's fresh state layer by layer, so a file of another model, another
//! cache type or a damaged one is refused with the reason, never loaded into a sequence.

use crate::config::KvType;
use crate::error::{EngineError, Result};
use crate::state::{KvBuf, KvCache, LayerState, SeqState};

const MAGIC: &[u8; 8] = b"XWENSEQ\0";
const VERSION: u32 = 1;

fn bad(why: impl Into<String>) -> EngineError {
    EngineError::State(format!("saved sequence state: {}", why.into()))
}

fn kv_tag(t: KvType) -> u8 {
    match t {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    put_u64(out, v.len() as u64);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn put_kv(out: &mut Vec<u8>, b: &KvBuf) {
    out.push(kv_tag(b.ty()));
    match b {
        KvBuf::F32(v) => put_f32s(out, v),
        KvBuf::F16(v) => {
            put_u64(out, v.len() as u64);
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        KvBuf::Q8_0(v) => {
            put_u64(out, v.len() as u64);
            out.extend_from_slice(v);
        }
    }
}

/// `state` (at `state.pos`) as bytes, tagged with the model's `fingerprint`; a state on a
/// device is read back first (its error, the device's).
pub fn encode(state: &SeqState, fingerprint: u64) -> crate::error::Result<Vec<u8>> {
    if state.is_on_device() {
        return encode(&state.to_host()?, fingerprint);
    }
    let mut out = Vec::with_capacity(state.bytes() + 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    put_u64(&mut out, fingerprint);
    put_u64(&mut out, state.pos as u64);
    put_u64(&mut out, state.layers.len() as u64);
    for l in &state.layers {
        match l {
            LayerState::Attn(kv) => {
                out.push(0);
                put_kv(&mut out, &kv.k);
                put_kv(&mut out, &kv.v);
            }
            LayerState::Delta(d) => {
                out.push(1);
                put_f32s(&mut out, &d.conv);
                put_f32s(&mut out, &d.s);
            }
        }
    }
    Ok(out)
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(bad("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// A length, refused when its elements of `size` bytes cannot be in what is left.
    fn len(&mut self, size: usize) -> Result<usize> {
        let n = self.u64()?;
        if n.checked_mul(size as u64).is_none_or(|b| b > self.b.len() as u64) {
            return Err(bad(format!("a length of {n} runs past the end")));
        }
        Ok(n as usize)
    }
    fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.len(4)?;
        Ok(self.take(n * 4)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
    }
    fn kv(&mut self, want: KvType) -> Result<KvBuf> {
        let tag = self.u8()?;
        if tag != kv_tag(want) {
            return Err(bad(format!("a KV cache of another type (tag {tag}; this model's is {want:?})")));
        }
        Ok(match want {
            KvType::F32 => KvBuf::F32(self.f32s()?),
            KvType::F16 => {
                let n = self.len(2)?;
                KvBuf::F16(self.take(n * 2)?.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect())
            }
            KvType::Q8_0 => {
                let n = self.len(1)?;
                if n % 34 != 0 {
                    return Err(bad("a q8_0 cache of partial blocks"));
                }
                KvBuf::Q8_0(self.take(n)?.to_vec())
            }
        })
    }
}

/// The state `bytes` hold, checked against `fresh` (the model's empty state: its layer kinds,
/// cache types and recurrent sizes) and `fingerprint`.
pub fn decode(bytes: &[u8], fingerprint: u64, fresh: SeqState) -> Result<SeqState> {
    let mut r = Reader { b: bytes };
    if r.take(8)? != MAGIC {
        return Err(bad("not an xwen sequence state"));
    }
    let v = r.u32()?;
    if v != VERSION {
        return Err(bad(format!("version {v}, this build reads {VERSION}")));
    }
    if r.u64()? != fingerprint {
        return Err(bad("saved for another model or cache configuration"));
    }
    let pos = r.u64()? as usize;
    let n_layers = r.u64()? as usize;
    let mut st = fresh;
    if n_layers != st.layers.len() {
        return Err(bad(format!("{n_layers} layers for a model of {}", st.layers.len())));
    }
    for (i, l) in st.layers.iter_mut().enumerate() {
        let kind = r.u8()?;
        match (kind, l) {
            (0, LayerState::Attn(kv)) => {
                let (kt, vt) = (kv.k.ty(), kv.v.ty());
                let (k, v) = (r.kv(kt)?, r.kv(vt)?);
                if k.len() % pos.max(1) != 0 || (pos == 0 && !k.is_empty()) {
                    return Err(bad(format!("layer {i}: {} K elements for {pos} positions", k.len())));
                }
                *kv = KvCache { k, v, max_rows: kv.max_rows };
            }
            (1, LayerState::Delta(d)) => {
                let (conv, s) = (r.f32s()?, r.f32s()?);
                if conv.len() != d.conv.len() || s.len() != d.s.len() {
                    return Err(bad(format!("layer {i}: a recurrent state of another size")));
                }
                d.conv = conv;
                d.s = s;
            }
            (k, _) => return Err(bad(format!("layer {i} is of another kind ({k})"))),
        }
    }
    if !r.b.is_empty() {
        return Err(bad(format!("{} bytes after the last layer", r.b.len())));
    }
    st.pos = pos;
    Ok(st)
}
