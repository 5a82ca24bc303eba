#!/bin/sh
# The stand-in image's entrypoint, as upstream's: `serve` starts TorchServe with the image's
# config.properties; anything else is run as given (servinglab's pods give their own command).
set -e
if [ "${1:-}" = "serve" ]; then
    shift
    exec torchserve --foreground --ts-config /home/model-server/config.properties --disable-token-auth "$@"
fi
exec "$@"
