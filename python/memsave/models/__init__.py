"""The built-in benchmark models (vgg16, unet, resnet50, gpt2 at sizes tiny, cpu and full) with their seeded
synthetic data: what ``python -m memsave bench/estimate --model NAME``, the examples and ``benchmarks/`` run.

=============  ===================================================================================================
``zoo.py``     the models, :data:`SIZES`, :func:`build` (a :class:`BenchCase`: model, inputs, loss) and
               :class:`ShapeCrossEntropy` (cross-entropy against targets shaped from the output)
=============  ===================================================================================================

These are test and benchmark subjects, not part of measuring: :mod:`memsave.measurement` never imports them. The
Hugging Face / timm / torchvision models at small configs and the plain-torch Llama modules that the tests and
benchmarks also use are test scaffolding and do not ship: tests/helpers/hub.py and tests/helpers/eager.py.
"""

from .zoo import GPT, MODELS, SIZES, VGG16, BenchCase, ResNet50, ShapeCrossEntropy, UNet, build

__all__ = ["GPT", "MODELS", "SIZES", "VGG16", "BenchCase", "ResNet50", "ShapeCrossEntropy", "UNet", "build"]
