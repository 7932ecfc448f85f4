"""A model pipetrain rejects: nn.LSTM has no hardware stage. `pipetrain compile` names it."""

from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(64, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


model = Net()
