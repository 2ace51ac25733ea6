# Per-call compute times of torchvision.models.vgg16 (bench/train/profile_layers.py):
# batch 16, image 32x32, 1 torch thread(s), torch 1.13.0a0, cpu: Intel(R) Xeon(R) Processor; median of 5 runs
# sums: forward 1708.0 ms, backward 2920.3 ms; the whole model: forward 1797.5 ms, backward 2922.3 ms
# batch: 16
# image: 32
# Format: <module> <forward us> <backward us>, in the forward pass's call order
features.0 999 1156
features.1 460 1266
features.2 9906 23455
features.3 481 1364
features.4 5974 1737
features.5 4653 10175
features.6 315 713
features.7 7985 16949
features.8 222 729
features.9 2645 679
features.10 3741 8598
features.11 83 326
features.12 7334 17649
features.13 91 338
features.14 8046 16941
features.15 114 263
features.16 1250 341
features.17 4460 10736
features.18 26 158
features.19 8458 21858
features.20 23 143
features.21 8060 21961
features.22 26 151
features.23 620 152
features.24 3555 14222
features.25 8 31
features.26 3392 14099
features.27 7 36
features.28 3369 20140
features.29 13 118
features.30 186 114
avgpool 6056 5685
classifier.0 1348704 2307185
classifier.1 11 68
classifier.2 1077 74
classifier.3 215706 339636
classifier.4 11 57
classifier.5 1125 84
classifier.6 48788 60862
loss 20 32
