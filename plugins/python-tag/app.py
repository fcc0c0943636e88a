"""A transformer in Python, built with componentize-py: adds
`"tagged_by": "python"` to a JSON object payload, or refuses the event
permanently when the payload says `"reject": true`."""

import json

import wit_world
from wit_world.imports import types
from componentize_py_types import Err


class WitWorld(wit_world.WitWorld):
    def transform(self, event: types.Event) -> list[types.OutgoingMessage]:
        doc = json.loads(bytes(event.payload))
        if doc.get("reject"):
            raise Err(types.PluginError_Permanent(f"event {event.id}: rejected by the python plugin"))
        doc["tagged_by"] = "python"
        return [
            types.OutgoingMessage(
                topic=None,
                key=event.key,
                payload=json.dumps(doc, separators=(",", ":")).encode(),
                headers=event.headers,
            )
        ]
