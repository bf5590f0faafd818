"""Adam whose dense update is one fused TensorFlow kernel per variable.

Keras 3's Adam composes its update from about ten element-wise ops per variable; on the
two 12M-parameter matrices of Mult-VAE at ML-20M scale that is a tenth of a training step on
CPU. ``ResourceApplyAdam`` computes the same update (``m += (1-b1)(g-m)``, ``v += (1-b2)(g^2-v)``,
``w -= lr sqrt(1-b2^t)/(1-b1^t) m/(sqrt(v)+eps)``) in one multi-threaded kernel. Variables,
slots and checkpoints are Keras' own, so this is a drop-in ``keras.optimizers.Adam``
(including inside ``LossScaleOptimizer``).
"""

from __future__ import annotations

import keras
import tensorflow as tf


class FusedAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` with a fused dense update (same math, same variables)."""

    # A boolean tensor set by ``SkippingLossScale`` for one ``apply``: where False, the update
    # runs with beta 1, learning rate 0 and zero gradients, which leaves var, m and v as
    # they were (the skip of a non-finite float16 step, without a conditional).
    apply_if: tf.Tensor | None = None

    def _backend_update_step(self, grads: list, trainable_variables: list,
                             learning_rate: tf.Tensor) -> None:
        """Every variable's update from one set of scalars (``beta^t``, casts): computing them
        per variable was ~59 scalar kernel launches of a ~300-launch GPU step (8 variables)."""
        if self.amsgrad or any(isinstance(g, tf.IndexedSlices) for g in grads):
            if self.apply_if is not None:
                raise ValueError("FusedAdam: a conditional update needs dense gradients")
            super()._backend_update_step(grads, trainable_variables, learning_rate)
            return
        scalars: dict[tf.DType, dict[str, tf.Tensor]] = {}
        for gradient, variable in zip(grads, trainable_variables, strict=True):
            dtype = variable.dtype
            if dtype not in scalars:
                scalars[dtype] = self._scalars(tf.as_dtype(dtype), learning_rate)
            grad = tf.cast(gradient, dtype)
            if self.apply_if is not None:
                grad = tf.where(self.apply_if, grad, tf.zeros_like(grad))  # no inf * 0
            index = self._get_variable_index(variable)
            tf.raw_ops.ResourceApplyAdam(
                var=variable.value.handle, m=self._momentums[index].value.handle,
                v=self._velocities[index].value.handle, grad=grad, use_locking=False,
                **scalars[dtype])

    def _scalars(self, dtype: tf.DType, learning_rate: tf.Tensor) -> dict[str, tf.Tensor]:
        step = tf.cast(self.iterations + 1, dtype)
        beta1, beta2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        scalars = {"beta1_power": tf.pow(beta1, step), "beta2_power": tf.pow(beta2, step),
                   "lr": tf.cast(learning_rate, dtype), "beta1": beta1, "beta2": beta2,
                   "epsilon": tf.cast(self.epsilon, dtype)}
        if self.apply_if is not None:
            one, zero = tf.constant(1, dtype), tf.constant(0, dtype)
            scalars.update(beta1=tf.where(self.apply_if, beta1, one),
                           beta2=tf.where(self.apply_if, beta2, one),
                           lr=tf.where(self.apply_if, scalars["lr"], zero))
        return scalars


class SkippingLossScale(keras.optimizers.LossScaleOptimizer):
    """Keras' dynamic loss scaling around a ``FusedAdam``, with no conditional in the step.

    Keras skips a non-finite step with two ``cond`` s: on a GPU their predicates are read by
    the host, which waits mid-step for the whole backward before it can launch Adam. Here a
    skipped step is an update that changes nothing (``FusedAdam.apply_if``) and the scale and
    its counter are selected with ``where``: the same variables and the same results.
    """

    def apply(self, grads: list, trainable_variables: list | None = None) -> None:
        inner = self.inner_optimizer
        if not isinstance(inner, FusedAdam):
            raise TypeError("SkippingLossScale wraps a FusedAdam")
        if not self.built:
            self.build(trainable_variables)
        finite = self.check_finite(grads)
        scale = tf.convert_to_tensor(self.dynamic_scale)
        inner.apply_if = finite
        try:
            inner.apply([g / scale for g in grads], trainable_variables)
        finally:
            inner.apply_if = None
        inner.iterations.assign_sub(1 - tf.cast(finite, inner.iterations.dtype))
        counter = tf.convert_to_tensor(self.step_counter)
        grow = tf.logical_and(finite, tf.equal(counter, self.dynamic_growth_steps - 1))
        self.step_counter.assign(
            tf.where(tf.logical_and(finite, tf.logical_not(grow)), counter + 1, 0))
        self.dynamic_scale.assign(
            tf.where(finite, tf.where(grow, scale * 2.0, scale), scale * 0.5))
