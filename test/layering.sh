#!/usr/bin/env bash
# What the build alone does not hold (issue 24, docs/design.md): the tools
# use the public library only, and the model engine (src/nn), compiled into
# libtide with src/ on its include path, still calls only the public API.
# Exits 1 naming each file and line that breaks a rule.
set -uo pipefail
src=${1:?usage: layering.sh SOURCE_DIR}
cd "$src" || exit 1
modules='core|store|transport|comm|coll|compress|optim|gpu|data|monitor|policy|train|sched|plan|nn'
bad=0
report() { # rule, then grep's file:line:text lines on stdin
  local rule=$1 line
  while IFS= read -r line; do
    echo "layering: $line: $rule"
    bad=1
  done
}
report "a tool includes a header under src/ (use include/tide.h or include/tide_nn.h)" \
  < <(grep -nE "#include[[:space:]]+\"($modules)/" tools/*.c tools/*.h 2>/dev/null)
report "a tool links something besides tide_static, the installed library" \
  < <(grep -nE 'target_link_libraries' tools/CMakeLists.txt | grep -vE 'PRIVATE tide_static\)$' | sed 's|^|tools/CMakeLists.txt:|')
report "src/nn includes another module's header (it may use tide.h alone)" \
  < <(grep -nE "#include[[:space:]]+\"($modules)/" src/nn/*.c src/nn/*.h | grep -vE '#include[[:space:]]+"nn/')
report "src/nn calls libtide's internals (use the public tide_* calls)" \
  < <(grep -nE '\btide__[a-z_0-9]+|\bTIDE__[A-Z_0-9]+|\bTIDE_(ERROR|WARN|INFO|DEBUG|TRACE)\(' src/nn/*.c src/nn/*.h)
[ $bad = 0 ] && echo "layering: tools include and link only the public library; src/nn calls only tide.h"
exit $bad
