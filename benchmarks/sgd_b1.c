/* Batch-1 SGD with momentum for a ReLU MLP, float32: the "compiled_b1" CPU peer of
 * benchmarks/cpu_peers.py (docs: README "Benchmarks").
 *
 * Built by cpu_peers.py with the machine's C compiler: cc -O3 -march=native -shared -fPIC.
 * Called through ctypes; one call trains `steps` samples in the given order.
 *
 * Network: L Linear layers, sizes[0] inputs ... sizes[L] logits, ReLU after every layer but the
 * last, softmax cross-entropy loss on the logits (PyTorch's nn.Linear / nn.ReLU /
 * nn.CrossEntropyLoss at batch 1).
 * Parameters, flat: for each layer l, W_l (sizes[l+1] x sizes[l], row-major, PyTorch's
 * nn.Linear.weight layout), then b_l (sizes[l+1]). `vel` has the same layout (momentum buffers).
 * Update, per sample, every layer after the whole backward pass is computed from the old weights
 * (torch.optim.SGD, dampening 0, no Nesterov):
 *     g = dL/dp + weight_decay * p;   v = momentum * v + g;   p = p - lr * v
 * (with v = 0 at the start this equals PyTorch's first-step buffer v = g).
 * Source: derived — the definition of backpropagation and of torch.optim.SGD's update.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PT_MAX_LAYERS 64
#define PT_ACC 32 /* independent partial sums of a dot product: the compiler vectorises them */

/* sum_c w[c] * a[c], in PT_ACC interleaved partial sums (C does not let the compiler reorder a
 * single float sum, so a plain loop runs at one add latency per multiply) */
static inline float dot(const float *w, const float *a, int n)
{
    float acc[PT_ACC] = {0.0f};
    int c = 0;
    for (; c + PT_ACC <= n; c += PT_ACC)
        for (int k = 0; k < PT_ACC; k++)
            acc[k] += w[c + k] * a[c + k];
    float s = 0.0f;
    for (int k = 0; k < PT_ACC; k++)
        s += acc[k];
    for (; c < n; c++)
        s += w[c] * a[c];
    return s;
}

/* Returns 0, or -1 for more than PT_MAX_LAYERS layers, -2 when memory cannot be allocated,
 * -3 for a label outside [0, sizes[L]). */
int pt_train(int layers, const int *sizes, float *params, float *vel, const float *x,
             const int *y, const int *order, long steps, float lr, float momentum,
             float weight_decay)
{
    if (layers < 1 || layers > PT_MAX_LAYERS)
        return -1;
    long woff[PT_MAX_LAYERS], boff[PT_MAX_LAYERS], aoff[PT_MAX_LAYERS + 1];
    long p = 0, a = 0, widest = 0;
    for (int l = 0; l < layers; l++) {
        woff[l] = p;
        p += (long)sizes[l + 1] * sizes[l];
        boff[l] = p;
        p += sizes[l + 1];
    }
    for (int l = 0; l <= layers; l++) {
        aoff[l] = a;
        a += sizes[l];
        if (sizes[l] > widest)
            widest = sizes[l];
    }
    float *act = malloc(sizeof(float) * (size_t)a);  /* a_0 = x, a_l = relu(z_l), a_L = z_L */
    float *delta = malloc(sizeof(float) * (size_t)widest);
    float *dprev = malloc(sizeof(float) * (size_t)widest);
    if (!act || !delta || !dprev) {
        free(act);
        free(delta);
        free(dprev);
        return -2;
    }
    const int n_in = sizes[0], n_out = sizes[layers];
    int rc = 0;
    for (long t = 0; t < steps; t++) {
        const long i = order[t];
        const int label = y[i];
        if (label < 0 || label >= n_out) {
            rc = -3;
            break;
        }
        memcpy(act, x + i * n_in, sizeof(float) * (size_t)n_in);
        /* forward */
        for (int l = 0; l < layers; l++) {
            const int in = sizes[l], out = sizes[l + 1];
            const float *W = params + woff[l], *b = params + boff[l], *ain = act + aoff[l];
            float *aout = act + aoff[l + 1];
            for (int r = 0; r < out; r++) {
                const float s = dot(W + (long)r * in, ain, in) + b[r];
                aout[r] = (l < layers - 1 && s < 0.0f) ? 0.0f : s;
            }
        }
        /* softmax cross-entropy: delta = softmax(z) - onehot(label) */
        const float *z = act + aoff[layers];
        float zmax = z[0];
        for (int k = 1; k < n_out; k++)
            if (z[k] > zmax)
                zmax = z[k];
        float sum = 0.0f;
        for (int k = 0; k < n_out; k++) {
            delta[k] = expf(z[k] - zmax);
            sum += delta[k];
        }
        for (int k = 0; k < n_out; k++)
            delta[k] /= sum;
        delta[label] -= 1.0f;
        /* backward, last layer first; the input gradient uses the weights before the update */
        for (int l = layers - 1; l >= 0; l--) {
            const int in = sizes[l], out = sizes[l + 1];
            float *W = params + woff[l], *b = params + boff[l];
            float *VW = vel + woff[l], *Vb = vel + boff[l];
            const float *ain = act + aoff[l];
            if (l > 0) {
                for (int c = 0; c < in; c++)
                    dprev[c] = 0.0f;
                for (int r = 0; r < out; r++) {
                    const float *w = W + (long)r * in;
                    const float d = delta[r];
                    for (int c = 0; c < in; c++)
                        dprev[c] += w[c] * d;
                }
                for (int c = 0; c < in; c++)
                    if (ain[c] <= 0.0f)  /* ReLU: gradient where the output is > 0 */
                        dprev[c] = 0.0f;
            }
            for (int r = 0; r < out; r++) {
                float *w = W + (long)r * in, *vw = VW + (long)r * in;
                const float d = delta[r];
                for (int c = 0; c < in; c++) {
                    const float g = d * ain[c] + weight_decay * w[c];
                    vw[c] = momentum * vw[c] + g;
                    w[c] -= lr * vw[c];
                }
                const float g = d + weight_decay * b[r];
                Vb[r] = momentum * Vb[r] + g;
                b[r] -= lr * Vb[r];
            }
            if (l > 0) {
                float *tmp = delta;
                delta = dprev;
                dprev = tmp;
            }
        }
    }
    free(act);
    free(delta);
    free(dprev);
    return rc;
}
