"""What every encoder family's megatron module does the same way (ERNIE, RoFormer, ELECTRA, ERNIE-M): receive a
pipeline stage's input, describe itself for distributed checkpoints, and compute every position on request."""

from __future__ import annotations

import contextlib


class EncoderStages:
    """Mixin placed before megatron's ``LanguageModule``; the module has ``encoder`` (a TransformerBlock whose
    layers may compute the [CLS] row only), ``drops_padding``, ``pre_process``/``post_process``."""

    def set_input_tensor(self, input_tensor) -> None:
        """Called by megatron's pipeline schedules with the previous stage's activations."""
        if isinstance(input_tensor, (list, tuple)):
            input_tensor = input_tensor[0]
        self.encoder.set_input_tensor(input_tensor)

    def _generic_checkpoint_view(self) -> bool:
        """Whether this chunk takes MegatronModule's generic checkpoint view (every parameter; a replicated head
        replicated): LanguageModule's expects a vocabulary projection on a last stage that does not tie it, and a
        task head (classifier, span or tagging) has none."""
        return bool(self.post_process and not self.share_embeddings_and_output_weights
                    and not hasattr(self, "output_layer"))

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """megatron's distributed-checkpoint view of this chunk (see :meth:`_generic_checkpoint_view`)."""
        if self._generic_checkpoint_view():
            from megatron.core.transformer.module import MegatronModule
            from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

            return MegatronModule.sharded_state_dict(self, prefix, sharded_offsets,
                                                     ensure_metadata_has_dp_cp_group(metadata))
        return super().sharded_state_dict(prefix, sharded_offsets, metadata)

    @contextlib.contextmanager
    def all_positions(self):
        """Compute every position of every layer for the duration (for ``output_hidden_states``): no
        padding dropped, no [CLS]-only last layer."""
        saved = self.drops_padding
        layers = [layer for layer in self.encoder.layers if layer.first_token_only]
        self.drops_padding = False
        for layer in layers:
            layer.set_first_token_only(False)
        try:
            yield
        finally:
            self.drops_padding = saved
            for layer in layers:
                layer.set_first_token_only(True)
