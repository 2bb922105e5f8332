"""The server-less broker of the embedded setup: kombu's filesystem transport with atomic writes.

kombu's filesystem channel creates a message file under its final name and only then writes the
payload; a consumer polling the folder can take the file in between and read an empty message
(`JSONDecodeError`, which stops the whole worker). Here the payload is written to a hidden
temporary file first and renamed into place (atomic on one file system), so a consumer only ever
sees complete messages.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: dict, **kwargs: object) -> None:
        """Put `payload` onto `queue`: written in full, then renamed to its queue's name."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        try:
            # A leading dot and no ".<queue>.msg" suffix: no consumer ever picks the partial file.
            fd, partial = tempfile.mkstemp(prefix=".partial-", dir=self.data_folder_out)
            with os.fdopen(fd, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
