# Sourced by the device session scripts (bench/*_session.sh) from the repository root: installs the
# carried wheels (WHEELS, default .whl) into /tmp/site once, sets `src` to the Helios source served
# (.anchor/src.tgz where present: a commit's src, `git archive --format=tar.gz HEAD src`, whatever
# the working tree holds; else ./src) and puts both on PYTHONPATH.
wheels=${WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
src=$PWD/src
if [ -f .anchor/src.tgz ]; then
  rm -rf /tmp/new && mkdir -p /tmp/new && tar -xzf .anchor/src.tgz -C /tmp/new || exit 1
  src=/tmp/new/src
fi
export PYTHONPATH=$src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
