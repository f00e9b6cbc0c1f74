# Sourced by .ci/install-node-clients.sh and .ci/install-agent-clis.sh: install pinned npm packages into a
# prefix, without install scripts, doing nothing for a pin that is already there at its version.
#   install_pins LABEL PREFIX NAME@VERSION...

pin_installed() {  # pin_installed PREFIX NAME@VERSION -> true when PREFIX/node_modules/NAME is at VERSION
  local name="${2%@*}" version="${2##*@}" manifest
  manifest="$1/node_modules/$name/package.json"
  [ -f "$manifest" ] && grep -q "\"version\": *\"$version\"" "$manifest"
}

install_pins() {
  local label="$1" prefix="$2" pin
  shift 2
  local missing=()
  for pin in "$@"; do pin_installed "$prefix" "$pin" || missing+=("$pin"); done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "$label: already installed in $prefix ($*)"
    return 0
  fi
  mkdir -p "$prefix"
  [ -f "$prefix/package.json" ] || echo '{"private": true}' > "$prefix/package.json"
  echo "$label: installing ${missing[*]} into $prefix"
  npm install --prefix "$prefix" --ignore-scripts --no-audit --no-fund --loglevel=error --save-exact "$@"
}
