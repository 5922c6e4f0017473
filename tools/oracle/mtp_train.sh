#!/usr/bin/env bash
# Trains the MTP (NextN) draft heads of ../shared/models/tiny-qwen35{,moe} and converts them.
# The trainer and what it does: tools/oracle/mtp_train.py (its docstring).
#
#   tools/oracle/mtp_train.sh prep      # here (CPU): corpus tokens + packed checkpoints
#                                       #   -> target/mtp-train/carry (about 51 MB)
#   tools/oracle/mtp_train.sh device    # on the GPU machine, $OUT set: trains both heads at
#                                       #   once -> $OUT/<model>-mtp.safetensors, -train_log.json
#   tools/oracle/mtp_train.sh convert DIR   # here: DIR holds what `device` wrote; assembles the
#                                       #   HF checkpoints with their MTP block and converts them
#                                       #   -> tests/fixtures/mtp/trained/
#
# The device run as it was made (the `run` tool; the tree travels, the carry path with it):
#   run(carry=["target/mtp-train/carry"], command="bash tools/oracle/mtp_train.sh device")
# (tests/fixtures and models/demo untracked for the call so the tree fits in 64 MiB).
#
# Environment:
#   STDLIB     CPython 3.11.7's Lib folder, the models' training text (prep; default: this
#              python3's own stdlib, which must be 3.11.7: prep checks the held-out list)
#   MODELS     folder with tiny-qwen35/ and tiny-qwen35moe/ (default ../shared/models)
#   LLAMA_TAR  llama.cpp b11434 sdist tarball (convert; default target/llama-src/llama-next.tar.gz)
#   PY         python with torch, transformers 5.17, safetensors, tokenizers (default python3)
#   STEPS, BUDGET  max training steps and seconds for each head's training loop (device)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
MODELS=${MODELS:-../shared/models}
WORK=target/mtp-train
CARRY=$WORK/carry
NAMES="tiny-qwen35 tiny-qwen35moe"

case "${1:-}" in
prep)
  STDLIB=${STDLIB:-$($PY -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")}
  mkdir -p "$CARRY/data"
  $PY tools/oracle/mtp_train.py prep --stdlib "$STDLIB" --tokenizer "$MODELS/tiny-qwen35/tokenizer.json" \
      --meta "$MODELS/data_meta.json" --out "$CARRY/data"
  for m in $NAMES; do
    rm -rf "${CARRY:?}/$m"; mkdir -p "$CARRY/$m"
    cp "$MODELS/$m/config.json" "$CARRY/$m/"
    [ -f "$MODELS/$m/model.safetensors.index.json" ] && cp "$MODELS/$m/model.safetensors.index.json" "$CARRY/$m/"
    for f in "$MODELS/$m"/*.safetensors; do
      if [ "$m" = tiny-qwen35moe ]; then xz -T2 -3 -c "$f" > "$CARRY/$m/$(basename "$f").xz"  # to fit 64 MiB
      else cp "$f" "$CARRY/$m/"; fi
    done
  done
  du -sh "$CARRY"
  ;;
device)
  : "${OUT:?OUT must be set (the device machine sets it)}"
  W=$(mktemp -d)
  cp -r "$CARRY"/. "$W"/
  for f in "$W"/*/*.xz; do
    [ "$f" = "$W/data/train.u16.xz" ] && continue
    $PY -c "import lzma,sys; open(sys.argv[1][:-3],'wb').write(lzma.open(sys.argv[1]).read())" "$f" && rm "$f"
  done
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  pids=""
  for m in $NAMES; do
    PYTHONUNBUFFERED=1 $PY tools/oracle/mtp_train.py train --model "$W/$m" --data "$W/data" --out "$OUT" \
        --name "$m" --steps "${STEPS:-4000}" --time-budget "${BUDGET:-240}" --trunk-batch 128 \
        > "$OUT/$m-stdout.txt" 2>&1 &
    pids="$pids $!"
  done
  rc=0
  for p in $pids; do wait "$p" || rc=1; done
  for m in $NAMES; do echo "== $m"; grep -v "falling back\|Loading weights" "$OUT/$m-stdout.txt" | tail -n 40; done
  exit $rc
  ;;
convert)
  SRC=${2:?usage: mtp_train.sh convert DIR}
  LLAMA_TAR=${LLAMA_TAR:-target/llama-src/llama-next.tar.gz}
  mkdir -p "$WORK/llama" "$WORK/hf"
  [ -f "$WORK/llama/llama.cpp/convert_hf_to_gguf.py" ] || tar xzf "$LLAMA_TAR" -C "$WORK/llama"
  L=$WORK/llama/llama.cpp
  DST=tests/fixtures/mtp/trained
  mkdir -p "$DST"
  for m in $NAMES; do
    [ -f "$SRC/$m-mtp.safetensors" ] || { echo "skip $m: no $SRC/$m-mtp.safetensors"; continue; }
    $PY tools/oracle/mtp_train.py assemble --model "$MODELS/$m" --mtp "$SRC/$m-mtp.safetensors" --out "$WORK/hf/$m-mtp"
    LLAMA_CPP_DIR=$L PYTHONPATH=$L/gguf-py $PY tools/oracle/convert.py --force-pre qwen35 --outtype q8_0 --mtp \
        --outfile "$DST/mtp-$m-q8_0.gguf" "$WORK/hf/$m-mtp"
    LLAMA_CPP_DIR=$L PYTHONPATH=$L/gguf-py $PY tools/oracle/convert.py --force-pre qwen35 --outtype q8_0 \
        --outfile "$WORK/hf/$m-mtp-q8_0.gguf" "$WORK/hf/$m-mtp"
    # the full model with its nextn block ships only where it is small
    if [ "$(stat -c %s "$WORK/hf/$m-mtp-q8_0.gguf")" -lt 9000000 ]; then cp "$WORK/hf/$m-mtp-q8_0.gguf" "$DST/$m-mtp-q8_0.gguf"; fi
  done
  PYTHONPATH=$L/gguf-py $PY tools/oracle/mtp_train.py inspect "$DST"/*.gguf > "$WORK/inspect.json"
  ls -l "$DST"
  ;;
*) sed -n '2,26p' "$0"; exit 2 ;;
esac
