# shellcheck shell=bash
# vaecf-data: the data stages as an arbitrary uid writing a host folder, the image's --help and
# its one-line refusal of train (sourced by docker/check-images.sh).

check_data() {
  rm -rf "$CHECK_DIR/data"
  mkdir -p "$CHECK_DIR/data"
  chown "$RUN_UID" "$CHECK_DIR/data"
  say "data stages as uid $RUN_UID"
  in_image data "$RUN_UID" vaecf download --dataset synthetic --synthetic-users 300 \
    --synthetic-items 120 --output /data/raw
  in_image data "$RUN_UID" vaecf preprocess --input /data/raw --output /data/interactions
  in_image data "$RUN_UID" vaecf split --input /data/interactions --output /data/split
  [ "$(stat -c %u "$CHECK_DIR/data/split")" = "${RUN_UID%%:*}" ] || fail "split not owned by $RUN_UID"
  local out err
  out=$(in_image data "$RUN_UID" vaecf --help)
  grep -q '^  split ' <<< "$out" || fail "data image's help lacks split"
  ! grep -qE '^  (train|report|launch-mpijob) ' <<< "$out" || fail "data image lists stages it cannot run: $out"
  # buildah adds its own lines to stderr; the stage's own stderr is taken from stdout.
  err=$(in_image data "$RUN_UID" sh -c 'vaecf train --help 2>&1' 2>/dev/null) \
    && fail "train ran in the data image"
  [ "$(wc -l <<< "$err")" = 1 ] && grep -q 'vaecf-train' <<< "$err" \
    || fail "train in the data image should fail with one line naming vaecf-train: $err"
  in_image data "$RUN_UID" sh -c 'test ! -e /build && ! pip list 2>/dev/null | grep -qiE "^(tensorflow|keras|kfp) "' \
    || fail "data image holds build files or TensorFlow"
}
