"""{{name}}: a transformer. Adds "tagged_by": "{{name}}" to a JSON object
payload; refuses a payload that is not an object, permanently."""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import types


class WitWorld(wit_world.WitWorld):
    def transform(self, event):
        doc = json.loads(bytes(event.payload))
        if not isinstance(doc, dict):
            raise Err(types.PluginError_Permanent(f"event {event.id}: the payload is not a JSON object"))
        doc["tagged_by"] = "{{name}}"
        return [types.OutgoingMessage(None, event.key, json.dumps(doc).encode(), event.headers)]
