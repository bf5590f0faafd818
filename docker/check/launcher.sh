# shellcheck shell=bash
# vaecf-launcher: launch-mpijob --help, deploy's template and matplotlib as an arbitrary uid
# (sourced by docker/check-images.sh).

check_launcher() {
  say "launcher as uid $RUN_UID"
  in_image launcher "$RUN_UID" vaecf launch-mpijob --help > /dev/null
  in_image launcher "$RUN_UID" sh -c 'test -f "$VAECF_INFERENCESERVICE_TEMPLATE"' \
    || fail "launcher lacks the InferenceService template of vaecf deploy"
  local err
  err=$(in_image launcher "$RUN_UID" python -c 'import matplotlib.pyplot' 2>&1)
  [ -z "$err" ] || fail "matplotlib under uid $RUN_UID: $err"
}
